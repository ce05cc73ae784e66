/*
 * tcctl.c - the operator's command line over a tcd admin socket.
 *
 * NOTES
 *   tcctl turns its arguments into one request line (the grammar of
 *   tc_admin_cmd.h, checked here with the same parser before connecting),
 *   sends it, reads one JSON line back and prints it as tables, or as is
 *   with --json.  Exit status: 0 done, 1 refused or failed (the answer's
 *   "ok" is false), 2 usage error, 3 could not talk to tcd (no socket,
 *   permission denied, connection lost, no answer in time).
 *
 *   The socket: --socket PATH, else $TC_ADMIN_SOCKET, else the first path
 *   of $TC_ADMIN_SOCKETS (separated by blanks, commas or colons).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tc_admin_client.h"
#include "tc_admin_cmd.h"


enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_CONNECT = 3 };

#define MAX_ANSWER (64u * 1024u * 1024u)

typedef struct cmd_desc {
  const char *name;
  const char *args;
  const char *summary;
  const char *details;
} cmd_desc_t;

static const cmd_desc_t commands[] = {
  {"globals", "[--status S[,S...]] [--min-age SECONDS] [--name NAME] [--limit N]",
   "list unfinished global transactions, oldest first",
   "Lists the sessions in the store (every node's), oldest first, with their\n"
   "status, age, name, branch and lock counts, retries and last error.\n"
   "  --status S[,S...]  only these statuses (names such as Begin, AsyncCommitting,\n"
   "                     CommitRetrying, RollbackRetrying, RollbackFailed, or numbers)\n"
   "  --min-age SECONDS  only sessions begun at least this long ago\n"
   "  --name NAME        only this transaction name\n"
   "  --limit N          at most N rows (default 100, at most 10000)\n"
   "Options may also be written status=S, min-age=... as on the socket."},
  {"show", "XID", "show one global transaction with its branches, locks and waiters",
   "Shows the session (live, or finished from history), each branch with its\n"
   "resource, type, status, retry count and last error, its global locks, and the\n"
   "registrations waiting for them on this node."},
  {"locks", "[--xid XID] [--key ROWKEY | --prefix PREFIX] [--limit N]",
   "list global row locks and this node's wait queues",
   "Row keys are \"resource^^^table^^^pk\".  Without filters, every lock (up to\n"
   "--limit, default 1000) and every wait queue on this node."},
  {"history", "[--xid XID] [--status S[,S...]] [--name NAME] [--since T] [--until T] [--limit N]",
   "list finished global transactions, the latest first",
   "Lists the transactions that finished (global_history, kept for\n"
   "recovery.history_days), the latest first, with their final status, when\n"
   "they ended, how long they took, their name and how many branches they had.\n"
   "  --xid XID          only this one (tcctl show XID gives its branches)\n"
   "  --status S[,S...]  only these final statuses (Committed, Rollbacked,\n"
   "                     TimeoutRollbacked, RollbackFailed, ... or numbers)\n"
   "  --name NAME        only this transaction name\n"
   "  --since T          ended at T or later\n"
   "  --until T          ended at T or earlier\n"
   "  --limit N          at most N rows (default 100, at most 10000)\n"
   "T is how long ago (90s, 15m, 2h, 7d; a bare number is seconds) or a UTC\n"
   "time (2026-12-03, 2026-12-03T15:04, 2026-12-03T15:04:05Z)."},
  {"nodes", "", "list the cluster's nodes with their state (up, stalled, reconnecting, down) and the leader", NULL},
  {"stats", "[--all]", "this node's counters, and the sessions by status; --all: every node's, with totals",
   "Without --all: the counters of the node behind the socket, and the store's\n"
   "unfinished sessions by status.\n"
   "  --all  asks this node for the cluster's nodes (tcctl nodes), then each\n"
   "         node that is not down on the admin socket it registered, and\n"
   "         prints one column per node and a TOTAL column (averages are not\n"
   "         summed).  A node whose socket does not answer (on another host,\n"
   "         or stalled) is named below the table, and the exit status is 1."},
  {"rollback", "XID", "force a rollback",
   "From Begin: decides rollback now (as a TM would).  From RollbackRetrying,\n"
   "RollbackFailed, TimeoutRollback* or StopRollbackRetry: drives the rollback\n"
   "again now.  Refused when the decision was commit or a branch already\n"
   "committed phase two: that would break atomicity."},
  {"commit", "XID", "force a commit",
   "From Begin (before its deadline): decides commit now.  From CommitRetrying,\n"
   "CommitFailed or StopCommitRetry: drives the commit again now.  Refused when\n"
   "the decision was rollback or a branch already rolled back."},
  {"stop-retry", "XID", "stop phase-two retries of a transaction",
   "Moves a session in phase two to StopCommitRetry or StopRollbackRetry: the\n"
   "recovery leader leaves it alone until resume-retry, redrive, commit or\n"
   "rollback."},
  {"resume-retry", "XID", "resume stopped retries (the leader retries at once)", NULL},
  {"redrive", "XID", "re-send phase two now, following the recorded decision",
   "Drives phase two on this node now and waits for it (each branch call has a\n"
   "10 s timeout): failed or stopped sessions go back to their *Retrying status\n"
   "first.  Answers the status phase two reached."},
  {"delete", "XID", "delete lock and branch rows left behind by a finished transaction",
   "Only for sessions that are no longer live (finished, or unknown): removes\n"
   "their orphan lock_table and branch_table rows.  Refused for live sessions."},
  {"failpoint", "list | arm NAME=ACTION[@N][,...]", "list or arm fault-injection points (test builds)",
   "Only a tcd built with -DTX_FAILPOINTS=ON has them (the sanitizer build the\n"
   "tests use); others refuse.  ACTION is abort (the node kills itself with\n"
   "SIGKILL), stop (SIGSTOP), trace (a line on stderr) or off; @N fires on the\n"
   "Nth hit (default 1), then the point disarms.  Names: tc.begin.after_store,\n"
   "tc.register.after_store, tc.commit.before_decision, tc.commit.after_decision,\n"
   "tc.rollback.after_decision, tc.phase2.after_acks."},
  {"help", "[COMMAND]", "this text, or one command's", NULL},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char *prog = "tcctl";

static void usage(FILE *f) {
  fprintf(f,
          "usage: tcctl [--socket PATH] [--json] [--timeout SECONDS] [--watch SECONDS [--count N]]\n"
          "             COMMAND [ARGS...]\n"
          "       tcctl COMMAND --help\n"
          "\n"
          "Inspect and repair a tcd transaction coordinator over its admin socket.\n"
          "\n"
          "commands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++) {
    char head[96];
    snprintf(head, sizeof(head), "%s %s", commands[i].name, commands[i].args);
    if (strlen(head) > 28) fprintf(f, "  %s\n  %-28s %s\n", head, "", commands[i].summary);
    else fprintf(f, "  %-28s %s\n", head, commands[i].summary);
  }
  fprintf(f,
          "\n"
          "options:\n"
          "  -s, --socket PATH     admin socket (default: $TC_ADMIN_SOCKET, else the first\n"
          "                        of $TC_ADMIN_SOCKETS)\n"
          "  -j, --json            print the answer as JSON, unchanged\n"
          "  -t, --timeout SECONDS wait this long for the answer (default 60)\n"
          "  -w, --watch SECONDS   run a listing command again every SECONDS, clearing\n"
          "                        the screen on a terminal (interrupt to stop)\n"
          "  -n, --count N         with --watch: stop after N rounds\n"
          "  -h, --help            this text\n"
          "  -V, --version         print the version\n"
          "\n"
          "exit status: 0 done, 1 refused or failed, 2 usage error,\n"
          "             3 could not talk to tcd (socket missing, permission, no answer)\n");
}

static void command_help(const cmd_desc_t *c, FILE *f) {
  fprintf(f, "usage: tcctl [OPTIONS] %s %s\n\n%s.\n", c->name, c->args, c->summary);
  if (c->details) fprintf(f, "\n%s\n", c->details);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: ", prog);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see tcctl --help)\n");
  return EXIT_USAGE;
}

static const cmd_desc_t *find_command(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

/* ------------------------------------------------------- request line */

typedef struct {
  char buf[16384];
  size_t len;
  bool overflow;
} line_t;

static void put_raw(line_t *l, const char *s) {
  size_t n = strlen(s);
  if (l->len + n + 1 >= sizeof(l->buf)) {
    l->overflow = true;
    return;
  }
  memcpy(l->buf + l->len, s, n + 1);
  l->len += n;
}

static void put_word(line_t *l, const char *w) {
  char q[8300];
  if (l->len) put_raw(l, " ");
  if (tc_adm_quote(w, q, sizeof(q)) < 0) {
    l->overflow = true;
    return;
  }
  put_raw(l, q);
}

static void put_option(line_t *l, const char *key, const char *val) {
  char q[8300];
  if (l->len) put_raw(l, " ");
  put_raw(l, key);
  put_raw(l, "=");
  if (tc_adm_quote(val, q, sizeof(q)) < 0) {
    l->overflow = true;
    return;
  }
  put_raw(l, q);
}

/*
 * Options of a listing command: "--key VALUE", "--key=VALUE" or
 * "key=VALUE", for the socket keys in 'keys' (tcctl spells min_age as
 * --min-age; both are accepted).
 */
static int list_options(line_t *l, const char *cmd, int argc, char **argv, const char *const *keys) {
  for (int i = 0; i < argc; i++) {
    char name[64];
    const char *a = argv[i], *val = NULL;
    const char *eq = strchr(a, '=');
    if (a[0] == '-' && a[1] == '-') {
      a += 2;
      eq = strchr(a, '=');
    } else if (!eq) {
      return usage_error("unexpected argument \"%s\" for \"%s\"", argv[i], cmd);
    }
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    if (n == 0 || n >= sizeof(name)) return usage_error("bad option \"%s\"", argv[i]);
    memcpy(name, a, n);
    name[n] = '\0';
    for (char *p = name; *p; p++)
      if (*p == '-') *p = '_';
    if (eq) val = eq + 1;
    bool known = false;
    for (const char *const *k = keys; *k; k++) known = known || strcmp(*k, name) == 0;
    if (!known) return usage_error("unknown option \"%s\" for \"%s\"", argv[i], cmd);
    if (!val) {
      if (i + 1 >= argc) return usage_error("option \"%s\" needs a value", argv[i]);
      val = argv[++i];
    }
    put_option(l, name, val);
  }
  return 0;
}

/* Build the request for command 'cmd' with its arguments. */
static int build_line(const char *cmd, int argc, char **argv, line_t *l) {
  static const char *const globals_keys[] = {"status", "min_age", "name", "limit", NULL};
  static const char *const locks_keys[] = {"xid", "key", "prefix", "limit", NULL};
  static const char *const history_keys[] = {"xid", "status", "name", "since", "until", "limit", NULL};
  if (strcmp(cmd, "globals") == 0) {
    put_raw(l, "show globals");
    return list_options(l, cmd, argc, argv, globals_keys);
  }
  if (strcmp(cmd, "locks") == 0) {
    put_raw(l, "show locks");
    return list_options(l, cmd, argc, argv, locks_keys);
  }
  if (strcmp(cmd, "history") == 0) {
    put_raw(l, "show history");
    return list_options(l, cmd, argc, argv, history_keys);
  }
  if (strcmp(cmd, "stats") == 0 && argc == 1 && strcmp(argv[0], "--all") == 0) {
    put_raw(l, "stats"); /* to each node; main asks for the nodes first */
    return 0;
  }
  if (strcmp(cmd, "nodes") == 0 || strcmp(cmd, "stats") == 0) {
    if (argc) return usage_error("\"%s\" takes no arguments%s, got \"%s\"", cmd,
                                 strcmp(cmd, "stats") == 0 ? " but --all" : "", argv[0]);
    put_raw(l, strcmp(cmd, "nodes") == 0 ? "show nodes" : "stats");
    return 0;
  }
  if (strcmp(cmd, "failpoint") == 0) {
    if (argc == 1 && strcmp(argv[0], "list") == 0) {
      put_raw(l, "failpoint list");
      return 0;
    }
    if (argc == 2 && strcmp(argv[0], "arm") == 0) {
      put_raw(l, "failpoint arm");
      put_word(l, argv[1]);
      return 0;
    }
    return usage_error("usage: failpoint list | failpoint arm NAME=ACTION[@N][,...]");
  }
  /* show XID and the repairs: exactly one XID. */
  if (argc != 1) return usage_error(argc ? "\"%s\" takes one XID" : "\"%s\" needs an XID", cmd);
  if (argv[0][0] == '-') return usage_error("unknown option \"%s\" for \"%s\"", argv[0], cmd);
  if (strcmp(cmd, "show") == 0) put_raw(l, "show global");
  else put_raw(l, cmd);
  put_word(l, argv[0]);
  return 0;
}

/* ------------------------------------------------------------- socket */

static const char *default_socket(char *buf, size_t cap) {
  const char *s = getenv("TC_ADMIN_SOCKET");
  if (s && *s) return s;
  s = getenv("TC_ADMIN_SOCKETS");
  if (!s) return NULL;
  while (*s == ' ' || *s == '\t' || *s == ',' || *s == ':' || *s == '\n') s++;
  size_t n = strcspn(s, " \t,:\n");
  if (n == 0 || n >= cap) return NULL;
  memcpy(buf, s, n);
  buf[n] = '\0';
  return buf;
}

/* Send 'line' and read the answer line into '*out' (malloc'ed).  Returns
 * 0, or EXIT_CONNECT with why in 'why'. */
static int talk_quietly(const char *path, const char *line, double timeout_s, char **out, char *why, size_t whylen) {
  return tc_admin_talk(path, line, timeout_s, MAX_ANSWER, out, why, whylen) == 0 ? 0 : EXIT_CONNECT;
}

/* The same, saying why on stderr. */
static int talk(const char *path, const char *line, double timeout_s, char **out) {
  char why[512];
  int rc = talk_quietly(path, line, timeout_s, out, why, sizeof(why));
  if (rc != 0) fprintf(stderr, "%s: %s\n", prog, why);
  return rc;
}

/* ------------------------------------------------------------- output */

static const char *jstr(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A field as text: strings as they are, numbers, booleans yes/no, "-" for
 * null or missing. */
static void field(const json_t *o, const char *key, char *out, size_t cap) {
  const json_t *v = json_object_get(o, key);
  if (json_is_string(v)) snprintf(out, cap, "%s", json_string_value(v));
  else if (json_is_integer(v)) snprintf(out, cap, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v)) snprintf(out, cap, "%.3f", json_real_value(v));
  else if (json_is_true(v)) snprintf(out, cap, "yes");
  else if (json_is_false(v)) snprintf(out, cap, "no");
  else snprintf(out, cap, "-");
  /* One line per row: newlines and tabs in store text become blanks. */
  for (char *p = out; *p; p++)
    if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
}

static void duration(double s, char *out, size_t cap) {
  if (s < 0) snprintf(out, cap, "-");
  else if (s < 60) snprintf(out, cap, "%.1fs", s);
  else if (s < 3600) snprintf(out, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else if (s < 86400) snprintf(out, cap, "%dh%02dm", (int)(s / 3600), ((int)s % 3600) / 60);
  else snprintf(out, cap, "%dd%02dh", (int)(s / 86400), ((int)s % 86400) / 3600);
}

#define MAX_COLS 16
#define CELL 512

typedef struct {
  int ncols;
  const char *title[MAX_COLS];
  int maxw[MAX_COLS]; /* 0: unbounded */
  char (*cells)[MAX_COLS][CELL];
  int nrows, cap;
} table_t;

static void table_init(table_t *t, int ncols, const char *const *titles, const int *maxw) {
  memset(t, 0, sizeof(*t));
  t->ncols = ncols;
  for (int i = 0; i < ncols; i++) {
    t->title[i] = titles[i];
    t->maxw[i] = maxw ? maxw[i] : 0;
  }
}

static char (*table_row(table_t *t))[CELL] {
  if (t->nrows == t->cap) {
    int cap = t->cap ? t->cap * 2 : 16;
    void *n = realloc(t->cells, (size_t)cap * sizeof(*t->cells));
    if (!n) return NULL;
    t->cells = n;
    t->cap = cap;
  }
  memset(t->cells[t->nrows], 0, sizeof(*t->cells));
  return t->cells[t->nrows++];
}

static void table_print(table_t *t) {
  int w[MAX_COLS];
  for (int c = 0; c < t->ncols; c++) {
    w[c] = (int)strlen(t->title[c]);
    for (int r = 0; r < t->nrows; r++) {
      int l = (int)strlen(t->cells[r][c]);
      if (l > w[c]) w[c] = l;
    }
    if (t->maxw[c] && w[c] > t->maxw[c]) w[c] = t->maxw[c];
  }
  for (int r = -1; r < t->nrows; r++) {
    for (int c = 0; c < t->ncols; c++) {
      const char *s = r < 0 ? t->title[c] : t->cells[r][c];
      bool last = c == t->ncols - 1;
      int l = (int)strlen(s);
      if (l > w[c] && !last) printf("%.*s~", w[c] - 1, s);
      else if (last) printf("%s", s);
      else printf("%-*s", w[c], s);
      if (!last) printf("  ");
    }
    printf("\n");
  }
  free(t->cells);
  t->cells = NULL;
}

/* A cell that needs more than field(): it writes the text of row 'o'. */
typedef void (*cell_fn)(const json_t *o, char *out, size_t cap);

/* A column of a table of JSON objects: its title, the member it shows
 * (as field() writes it) or else the function that writes its cell, and
 * its width at most (0: unbounded). */
typedef struct column {
  const char *title;
  const char *key;
  cell_fn cell;
  int maxw;
} column_t;

/* Print the objects of the array 'rows' as a table, a row each. */
static void print_rows(const json_t *rows, const column_t *cols, int ncols) {
  const char *titles[MAX_COLS];
  int maxw[MAX_COLS];
  for (int c = 0; c < ncols; c++) {
    titles[c] = cols[c].title;
    maxw[c] = cols[c].maxw;
  }
  table_t t;
  table_init(&t, ncols, titles, maxw);
  size_t i;
  const json_t *o;
  json_array_foreach(rows, i, o) {
    char(*row)[CELL] = table_row(&t);
    if (!row) break;
    for (int c = 0; c < ncols; c++) {
      if (cols[c].cell) cols[c].cell(o, row[c], CELL);
      else field(o, cols[c].key, row[c], CELL);
    }
  }
  table_print(&t);
}

/* Columns: one that shows member 'key', the same at most 'maxw' wide, and
 * one whose cell 'cell' writes. */
#define COL(title, key) {(title), (key), NULL, 0}
#define COL_MAX(title, key, maxw) {(title), (key), NULL, (maxw)}
#define COL_CELL(title, cell) {(title), NULL, (cell), 0}

#define PRINT_ROWS(rows, cols) print_rows((rows), (cols), (int)(sizeof(cols) / sizeof((cols)[0])))

/* The number member 'key' of 'o', a count of seconds, as a duration. */
static void seconds_cell(const json_t *o, const char *key, double per_second, char *out, size_t cap) {
  duration(json_number_value(json_object_get(o, key)) / per_second, out, cap);
}

static void age_cell(const json_t *o, char *out, size_t cap) { seconds_cell(o, "age_s", 1, out, cap); }

static void print_globals(const json_t *a) {
  static const column_t cols[] = {
    COL("XID", "xid"), COL("STATUS", "status"), COL_CELL("AGE", age_cell), COL_MAX("NAME", "name", 24),
    COL("BRANCHES", "branches"), COL("LOCKS", "locks"), COL("RETRIES", "retry_count"), COL("LAST ERROR", "last_error"),
  };
  const json_t *list = json_object_get(a, "globals");
  if (json_array_size(list)) PRINT_ROWS(list, cols);
  printf("%zu global transaction%s%s\n", json_array_size(list), json_array_size(list) == 1 ? "" : "s",
         json_is_true(json_object_get(a, "truncated")) ? " (more exist: raise --limit)" : "");
}

static void kv(const char *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void kv(const char *k, const char *fmt, ...) {
  va_list ap;
  printf("%-14s ", k);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

static void waiting_cell(const json_t *o, char *out, size_t cap) { seconds_cell(o, "waiting_ms", 1000.0, out, cap); }

static void times_out_cell(const json_t *o, char *out, size_t cap) {
  seconds_cell(o, "timeout_in_ms", 1000.0, out, cap);
}

static void print_waiters(const json_t *q, const char *indent) {
  static const column_t cols[] = {
    COL("WAITING XID", "xid"), COL_CELL("WAITING", waiting_cell), COL_CELL("TIMES OUT IN", times_out_cell),
  };
  (void)indent;
  PRINT_ROWS(q, cols);
}

/* A saga step's state in words, from its branch status's name. */
static const char *saga_state(const char *status) {
  static const struct {
    const char *status, *state;
  } map[] = {
    {"Registered", "waiting"},
    {"PhaseTwoCommitted", "action done"},
    {"PhaseTwoCommitFailedRetryable", "action retried"},
    {"PhaseTwoCommitFailedUnretryable", "action failed"},
    {"PhaseTwoRollbacked", "compensated"},
    {"PhaseTwoRollbackFailedRetryable", "compensation retried"},
    {"PhaseTwoRollbackFailedUnretryable", "compensation failed"},
  };
  for (size_t i = 0; status && i < sizeof(map) / sizeof(map[0]); i++)
    if (strcmp(map[i].status, status) == 0) return map[i].state;
  return status ? status : "?";
}

/* The saga steps among 'branches' (in branch id order: the order they
 * run in), with their args. */
static void print_saga_steps(const json_t *branches) {
  size_t i, n = 0;
  const json_t *b;
  json_array_foreach(branches, i, b) {
    const char *type = json_string_value(json_object_get(b, "branch_type"));
    if (type && strcmp(type, "SAGA") == 0) n++;
  }
  if (n == 0) return;
  printf("\n%zu saga step%s (actions in this order, compensations newest first)\n", n, n == 1 ? "" : "s");
  static const char *const titles[] = {"STEP", "BRANCH", "RESOURCE", "STATE", "ARGS"};
  static const int maxw[] = {0, 0, 0, 0, 60};
  table_t t;
  table_init(&t, 5, titles, maxw);
  size_t step = 0;
  json_array_foreach(branches, i, b) {
    const char *type = json_string_value(json_object_get(b, "branch_type"));
    if (!type || strcmp(type, "SAGA") != 0) continue;
    char(*row)[CELL] = table_row(&t);
    if (!row) break;
    snprintf(row[0], CELL, "%zu", ++step);
    field(b, "branch_id", row[1], CELL);
    field(b, "resource_id", row[2], CELL);
    snprintf(row[3], CELL, "%s", saga_state(json_string_value(json_object_get(b, "status"))));
    field(b, "application_data", row[4], CELL);
  }
  table_print(&t);
}

static void print_global(const json_t *a) {
  const json_t *g = json_object_get(a, "global");
  char v[CELL], v2[CELL];
  if (json_is_object(g)) {
    bool live = json_is_true(json_object_get(g, "live"));
    kv("xid:", "%s", jstr(g, "xid") ? jstr(g, "xid") : "-");
    field(g, "status_code", v, sizeof(v));
    kv("status:", "%s (%s)%s", jstr(g, "status") ? jstr(g, "status") : "?", v, live ? "" : ", finished");
    field(g, "transaction_id", v, sizeof(v));
    kv("id:", "%s", v);
    field(g, "name", v, sizeof(v));
    kv("name:", "%s", v);
    field(g, "application_id", v, sizeof(v));
    kv("application:", "%s", v);
    field(g, "begin_time", v, sizeof(v));
    if (live) {
      duration(json_number_value(json_object_get(g, "age_s")), v2, sizeof(v2));
      kv("begun:", "%s (%s ago)", v, v2);
      field(g, "node_id", v, sizeof(v));
      kv("node:", "%s", v);
      field(g, "timeout_ms", v, sizeof(v));
      field(g, "deadline", v2, sizeof(v2));
      kv("timeout:", "%s ms (deadline %s%s)", v, v2, json_is_true(json_object_get(g, "timed_out")) ? ", passed" : "");
      field(g, "retry_count", v, sizeof(v));
      field(g, "next_retry_at", v2, sizeof(v2));
      kv("retries:", "%s (next: %s)", v, v2);
      field(g, "last_error", v, sizeof(v));
      kv("last error:", "%s", v);
    } else {
      kv("begun:", "%s", v);
      field(g, "end_time", v, sizeof(v));
      kv("ended:", "%s", v);
      field(a, "leftover_branches", v, sizeof(v));
      kv("leftovers:", "%s branch rows, %zu lock rows (tcctl delete removes them)", v,
         json_array_size(json_object_get(a, "locks")));
    }
  } else {
    printf("no live session and no history: these rows are orphans (tcctl delete removes them)\n");
  }
  const json_t *branches = json_object_get(a, "branches");
  printf("\n%zu branch%s\n", json_array_size(branches), json_array_size(branches) == 1 ? "" : "es");
  if (json_array_size(branches)) {
    static const column_t cols[] = {
      COL("BRANCH", "branch_id"), COL("RESOURCE", "resource_id"), COL("TYPE", "branch_type"), COL("STATUS", "status"),
      COL("RETRIES", "retry_count"), COL("CLIENT", "client_id"), COL("LAST ERROR", "last_error"),
    };
    PRINT_ROWS(branches, cols);
    print_saga_steps(branches);
  }
  const json_t *locks = json_object_get(a, "locks");
  printf("\n%zu lock%s%s\n", json_array_size(locks), json_array_size(locks) == 1 ? "" : "s",
         json_is_true(json_object_get(a, "locks_truncated")) ? " (first ones only)" : "");
  if (json_array_size(locks)) {
    static const column_t cols[] = {
      COL("ROW KEY", "row_key"), COL("BRANCH", "branch_id"), COL("STATUS", "status"), COL("SINCE", "since"),
    };
    PRINT_ROWS(locks, cols);
  }
  const json_t *waiters = json_object_get(a, "waiters");
  if (json_array_size(waiters)) {
    printf("\n%zu registration%s waiting for its locks on this node\n", json_array_size(waiters),
           json_array_size(waiters) == 1 ? "" : "s");
    print_waiters(waiters, "");
  }
}

/* An orphan lock's holder has no status: it is gone. */
static void holder_status_cell(const json_t *l, char *out, size_t cap) {
  if (json_is_true(json_object_get(l, "orphan"))) snprintf(out, cap, "(orphan)");
  else field(l, "holder_status", out, cap);
}

static void print_locks(const json_t *a) {
  static const column_t cols[] = {
    COL("ROW KEY", "row_key"), COL("XID", "xid"), COL("BRANCH", "branch_id"), COL("STATUS", "status"),
    COL_CELL("HOLDER STATUS", holder_status_cell), COL("SINCE", "since"),
  };
  const json_t *list = json_object_get(a, "locks");
  if (json_array_size(list)) PRINT_ROWS(list, cols);
  printf("%zu lock%s%s\n", json_array_size(list), json_array_size(list) == 1 ? "" : "s",
         json_is_true(json_object_get(a, "truncated")) ? " (more exist: raise --limit)" : "");
  const json_t *groups = json_object_get(a, "waiters");
  size_t i;
  const json_t *g;
  json_array_foreach(groups, i, g) {
    printf("\nwaiting on this node for \"%s\":\n", jstr(g, "holder") ? jstr(g, "holder") : "?");
    print_waiters(json_object_get(g, "queue"), "  ");
  }
}

/* The node's id, marked " *" for the node that answers. */
static void node_cell(const json_t *n, char *out, size_t cap) {
  field(n, "node_id", out, cap);
  if (json_is_true(json_object_get(n, "self"))) strncat(out, " *", cap - strlen(out) - 1);
}

static void heartbeat_cell(const json_t *n, char *out, size_t cap) {
  char age[64];
  seconds_cell(n, "heartbeat_age_s", 1, age, sizeof(age));
  snprintf(out, cap, "%s ago", age);
}

static void print_nodes(const json_t *a) {
  static const column_t cols[] = {
    COL_CELL("NODE", node_cell), COL("STATE", "state"), COL("ADDRESS", "address"), COL("LEADER", "is_leader"),
    COL_CELL("HEARTBEAT", heartbeat_cell), COL("PID", "pid"), COL("VERSION", "version"),
    COL("ADMIN SOCKET", "admin_socket"),
  };
  const json_t *list = json_object_get(a, "nodes");
  if (json_array_size(list)) PRINT_ROWS(list, cols);
  const json_t *self = json_object_get(a, "self");
  char id[32];
  field(self, "node_id", id, sizeof(id));
  printf("this node: %s at %s, %s, %s\n", id, jstr(self, "address") ? jstr(self, "address") : "?",
         json_is_true(json_object_get(self, "leader")) ? "recovery leader" : "not the leader",
         json_is_true(json_object_get(self, "serving")) ? "serving" : "not serving");
}

static void print_value_tree(const json_t *o, int depth) {
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)(uintptr_t)o, k, v) {
    if (depth == 0 && strcmp(k, "ok") == 0) continue;
    if (json_is_object(v)) {
      printf("%*s%s:\n", depth * 2, "", k);
      print_value_tree(v, depth + 1);
    } else {
      char s[CELL];
      field(o, k, s, sizeof(s));
      printf("%*s%-*s %s\n", depth * 2, "", 22 - depth * 2, k, s);
    }
  }
}

static void print_repair(const json_t *a) {
  const char *action = jstr(a, "action"), *xid = jstr(a, "xid");
  if (action && strcmp(action, "delete") == 0) {
    const json_t *d = json_object_get(a, "deleted");
    long long locks = json_integer_value(json_object_get(d, "locks"));
    long long branches = json_integer_value(json_object_get(d, "branches"));
    if (!locks && !branches) printf("delete %s: nothing left to delete", xid ? xid : "?");
    else printf("delete %s: removed %lld lock row%s and %lld branch row%s", xid ? xid : "?", locks,
                locks == 1 ? "" : "s", branches, branches == 1 ? "" : "s");
    if (jstr(a, "history_status")) printf(" (finished %s)", jstr(a, "history_status"));
    printf("\n");
    return;
  }
  printf("%s %s: %s -> %s", action ? action : "?", xid ? xid : "?", jstr(a, "from") ? jstr(a, "from") : "?",
         jstr(a, "to") ? jstr(a, "to") : "?");
  if (jstr(a, "status"))
    printf("; phase two reached %s%s", jstr(a, "status"),
           json_is_true(json_object_get(a, "finished")) ? " (finished)" : "");
  printf("\n");
}

static void print_failpoints(json_t *a) {
  json_t *list = json_object_get(a, "failpoints");
  size_t i;
  json_t *f;
  printf("%-28s %-6s %s\n", "FAILPOINT", "ACTION", "FIRES AT HIT");
  json_array_foreach(list, i, f) {
    printf("%-28s %-6s %lld\n", jstr(f, "name") ? jstr(f, "name") : "", jstr(f, "action") ? jstr(f, "action") : "",
           (long long)json_integer_value(json_object_get(f, "fires_at_hit")));
  }
}

/* How long a finished transaction took: under a second in milliseconds. */
static void took_cell(const json_t *h, char *out, size_t cap) {
  double took = json_number_value(json_object_get(h, "duration_s"));
  if (took < 1) snprintf(out, cap, "%.0fms", took * 1000);
  else duration(took, out, cap);
}

static void print_history(const json_t *a) {
  static const column_t cols[] = {
    COL("XID", "xid"), COL("STATUS", "status"), COL("ENDED", "end_time"), COL_CELL("TOOK", took_cell),
    COL_MAX("NAME", "name", 24), COL("BRANCHES", "branches"),
  };
  const json_t *list = json_object_get(a, "history");
  if (json_array_size(list)) PRINT_ROWS(list, cols);
  printf("%zu finished transaction%s%s\n", json_array_size(list), json_array_size(list) == 1 ? "" : "s",
         json_is_true(json_object_get(a, "truncated")) ? " (more exist: raise --limit or narrow --since)" : "");
}

/* ---------------------------------------------------------- stats --all */

/* Averages and ratios are not summed across nodes. */
static bool summable(const char *key, const json_t *v) {
  if (json_is_integer(v)) return true;
  return json_is_real(v) && !strstr(key, "avg") && !strstr(key, "per_");
}

/* Add the counters of one node's stats answer 'from' into 'total'. */
static void add_totals(json_t *total, const json_t *from, int depth) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)(uintptr_t)from, k, v) {
    if (depth == 0 && (strcmp(k, "ok") == 0 || strcmp(k, "node") == 0 || strcmp(k, "sessions") == 0)) continue;
    json_t *t = json_object_get(total, k);
    if (json_is_object(v)) {
      if (!t) {
        t = json_object();
        json_object_set_new(total, k, t);
      }
      if (json_is_object(t)) add_totals(t, v, depth + 1);
    } else if (summable(k, v)) {
      double sum = json_number_value(v) + (t ? json_number_value(t) : 0);
      json_object_set_new(total, k, json_is_integer(v) && (!t || json_is_integer(t)) ? json_integer((json_int_t)sum)
                                                                                      : json_real(sum));
    }
  }
}

/* The leaves of 'o' as dotted paths ("globals.begun") into 'paths'. */
static void leaf_paths(const json_t *o, const char *prefix, json_t *paths, int depth) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)(uintptr_t)o, k, v) {
    if (depth == 0 && (strcmp(k, "ok") == 0 || strcmp(k, "node") == 0 || strcmp(k, "sessions") == 0)) continue;
    char path[256];
    if (snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", k) >= (int)sizeof(path))
      continue; /* no path of the nodes' stats is this long */
    if (json_is_object(v)) leaf_paths(v, path, paths, depth + 1);
    else json_array_append_new(paths, json_string(path));
  }
}

static const json_t *at_path(const json_t *o, const char *path) {
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", path);
  char *save = NULL;
  for (char *k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save)) o = json_object_get(o, k);
  return o;
}

static void print_stats_all(const json_t *a) {
  const json_t *nodes = json_object_get(a, "nodes"), *total = json_object_get(a, "total");
  const json_t *shown[MAX_COLS - 2];
  const char *titles[MAX_COLS];
  char heads[MAX_COLS][32];
  int ncols = 0;
  size_t i;
  const json_t *n;
  titles[ncols++] = "COUNTER";
  json_t *paths = json_array();
  json_array_foreach(nodes, i, n) {
    const json_t *st = json_object_get(n, "stats");
    if (!json_is_object(st) || ncols >= MAX_COLS - 1) continue;
    if (!json_array_size(paths)) leaf_paths(st, "", paths, 0);
    snprintf(heads[ncols], sizeof(heads[ncols]), "NODE %lld", (long long)json_integer_value(json_object_get(n, "node_id")));
    shown[ncols - 1] = st;
    titles[ncols] = heads[ncols];
    ncols++;
  }
  int nshown = ncols - 1;
  titles[ncols++] = "TOTAL";
  if (nshown > 0) {
    table_t t;
    table_init(&t, ncols, titles, NULL);
    const json_t *p;
    json_array_foreach(paths, i, p) {
      const char *path = json_string_value(p);
      char(*row)[CELL] = table_row(&t);
      if (!row) break;
      snprintf(row[0], CELL, "%s", path);
      for (int c = 0; c < nshown; c++) {
        const json_t *v = at_path(shown[c], path);
        json_t *wrap = json_pack("{s:O?}", "v", (json_t *)(uintptr_t)v);
        field(wrap, "v", row[c + 1], CELL);
        json_decref(wrap);
      }
      const json_t *tv = at_path(total, path);
      json_t *wrap = json_pack("{s:O?}", "v", (json_t *)(uintptr_t)tv);
      field(wrap, "v", row[ncols - 1], CELL);
      json_decref(wrap);
    }
    table_print(&t);
  }
  json_decref(paths);
  const json_t *sessions = json_object_get(a, "sessions");
  if (json_is_object(sessions) && json_object_size(sessions)) {
    printf("\nunfinished sessions in the store, by status:\n");
    print_value_tree(sessions, 1);
  } else if (json_is_object(sessions)) {
    printf("\nno unfinished sessions in the store\n");
  }
  int answered = 0;
  json_array_foreach(nodes, i, n) {
    if (json_is_object(json_object_get(n, "stats"))) {
      answered++;
      continue;
    }
    printf("node %lld: %s\n", (long long)json_integer_value(json_object_get(n, "node_id")),
           jstr(n, "error") ? jstr(n, "error") : "no answer");
  }
  printf("%d of %zu node%s answered\n", answered, json_array_size(nodes), json_array_size(nodes) == 1 ? "" : "s");
}

/* stats --all: the nodes from the node behind 'socket_path', then each
 * one's stats over the admin socket it registered.  Answers like a
 * command: EXIT_OK when every node that is not down answered. */
static int stats_all(const char *socket_path, double timeout_s, bool as_json) {
  char *answer = NULL;
  int rc = talk(socket_path, "show nodes", timeout_s, &answer);
  if (rc != 0) return rc;
  json_t *na = json_loads(answer, 0, NULL);
  free(answer);
  if (!json_is_object(na) || !json_is_true(json_object_get(na, "ok"))) {
    const char *e = json_is_object(na) ? jstr(na, "error") : NULL;
    fprintf(stderr, "%s: could not list the nodes: %s\n", prog, e ? e : "not a JSON answer");
    json_decref(na);
    return EXIT_REFUSED;
  }
  json_t *out = json_pack("{s:b}", "ok", 1), *list = json_array(), *total = json_object();
  json_t *sessions = NULL;
  int unreachable = 0;
  size_t i;
  json_t *n;
  json_array_foreach(json_object_get(na, "nodes"), i, n) {
    json_t *e = json_pack("{s:O?, s:O?, s:O?}", "node_id", json_object_get(n, "node_id"), "state",
                          json_object_get(n, "state"), "admin_socket", json_object_get(n, "admin_socket"));
    const char *state = jstr(n, "state"), *sock = jstr(n, "admin_socket");
    char why[512];
    if (state && strcmp(state, "down") == 0) {
      snprintf(why, sizeof(why), "down (not asked: its heartbeat is older than the lease)");
    } else if (!sock || !*sock) {
      snprintf(why, sizeof(why), "registered no admin socket");
      unreachable++;
    } else {
      char *sa = NULL;
      json_t *st = NULL;
      if (talk_quietly(sock, "stats", timeout_s, &sa, why, sizeof(why)) == 0) {
        st = json_loads(sa, 0, NULL);
        if (!json_is_object(st) || !json_is_true(json_object_get(st, "ok"))) {
          const char *msg = json_is_object(st) ? jstr(st, "error") : NULL;
          snprintf(why, sizeof(why), "refused: %s", msg ? msg : "not a JSON answer");
          json_decref(st);
          st = NULL;
        }
      }
      free(sa);
      if (st) {
        add_totals(total, st, 0);
        if (!sessions && json_is_object(json_object_get(st, "sessions")))
          sessions = json_incref(json_object_get(st, "sessions"));
        json_object_set_new(e, "stats", st);
        why[0] = '\0';
      } else {
        unreachable++;
      }
    }
    if (why[0]) json_object_set_new(e, "error", json_string(why));
    json_array_append_new(list, e);
  }
  json_decref(na);
  json_object_set_new(out, "nodes", list);
  json_object_set_new(out, "total", total);
  json_object_set_new(out, "sessions", sessions ? sessions : json_null());
  json_object_set_new(out, "unreachable", json_integer(unreachable));
  if (as_json) {
    char *text = json_dumps(out, JSON_COMPACT);
    if (text) printf("%s\n", text);
    free(text);
  } else {
    print_stats_all(out);
  }
  json_decref(out);
  return unreachable ? EXIT_REFUSED : EXIT_OK;
}

static void print_help_answer(const json_t *a) {
  size_t i;
  const json_t *c;
  json_array_foreach(json_object_get(a, "commands"), i, c)
    printf("%-60s %s\n", jstr(c, "usage") ? jstr(c, "usage") : "", jstr(c, "help") ? jstr(c, "help") : "");
}

/* ---------------------------------------------------------------- main */

/* Send the request and print its answer; the exit status. */
static int run_once(const char *socket_path, const line_t *line, const tc_adm_cmd_t *parsed, double timeout_s,
                    bool as_json) {
  char *answer = NULL;
  int rc = talk(socket_path, line->buf, timeout_s, &answer);
  if (rc != 0) return rc;
  json_error_t jerr;
  json_t *a = json_loads(answer, 0, &jerr);
  if (!json_is_object(a)) {
    fprintf(stderr, "%s: the answer is not a JSON object (%s): %.200s\n", prog, jerr.text, answer);
    json_decref(a);
    free(answer);
    return EXIT_CONNECT;
  }
  bool ok = json_is_true(json_object_get(a, "ok"));
  const char *code = jstr(a, "code");
  if (as_json) {
    printf("%s\n", answer);
  } else if (!ok) {
    fprintf(stderr, "%s: %s\n", prog, jstr(a, "error") ? jstr(a, "error") : "command failed");
  } else {
    switch (parsed->kind) {
    case TC_ADM_SHOW_GLOBALS: print_globals(a); break;
    case TC_ADM_SHOW_GLOBAL: print_global(a); break;
    case TC_ADM_SHOW_LOCKS: print_locks(a); break;
    case TC_ADM_SHOW_HISTORY: print_history(a); break;
    case TC_ADM_SHOW_NODES: print_nodes(a); break;
    case TC_ADM_STATS: print_value_tree(a, 0); break;
    case TC_ADM_HELP: print_help_answer(a); break;
    case TC_ADM_FAILPOINT_LIST:
    case TC_ADM_FAILPOINT_ARM: print_failpoints(a); break;
    default: print_repair(a); break;
    }
  }
  rc = ok ? EXIT_OK : code && strcmp(code, "denied") == 0 ? EXIT_CONNECT : EXIT_REFUSED;
  json_decref(a);
  free(answer);
  return rc;
}

/* Sleep 's' seconds (a signal ends the process, as for watch(1)). */
static void sleep_seconds(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int parse_seconds(const char *opt, const char *v, double max, double *out) {
  char *end;
  double d = strtod(v, &end);
  if (*end || end == v || !(d > 0) || d > max)
    return usage_error("invalid %s \"%s\": expected seconds, above 0 and at most %.0f", opt, v, max);
  *out = d;
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
    {"socket", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
    {"timeout", required_argument, NULL, 't'}, {"watch", required_argument, NULL, 'w'},
    {"count", required_argument, NULL, 'n'}, {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'}, {NULL, 0, NULL, 0},
  };
  const char *socket_path = NULL;
  bool as_json = false;
  double timeout_s = 60, watch_s = 0;
  long count = 0;
  int ch;
  /* '+': stop at the command, whose own arguments may look like options. */
  while ((ch = getopt_long(argc, argv, "+s:jt:w:n:hV", opts, NULL)) != -1) {
    switch (ch) {
    case 's': socket_path = optarg; break;
    case 'j': as_json = true; break;
    case 't':
      if (parse_seconds("--timeout", optarg, 86400, &timeout_s) != 0) return EXIT_USAGE;
      break;
    case 'w':
      if (parse_seconds("--watch", optarg, 86400, &watch_s) != 0) return EXIT_USAGE;
      break;
    case 'n': {
      char *end;
      count = strtol(optarg, &end, 10);
      if (*end || end == optarg || count < 1 || count > 1000000)
        return usage_error("invalid --count \"%s\": expected a number of refreshes, 1 or more", optarg);
      break;
    }
    case 'h': usage(stdout); return EXIT_OK;
    case 'V': printf("tcctl %s\n", TXC_VERSION); return EXIT_OK;
    default: usage(stderr); return EXIT_USAGE;
    }
  }
  if (optind >= argc) {
    usage(stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[optind];
  const cmd_desc_t *desc = find_command(cmd);
  if (!desc) return usage_error("unknown command \"%s\"", cmd);
  int cargc = argc - optind - 1;
  char **cargv = argv + optind + 1;
  for (int i = 0; i < cargc; i++) {
    if (strcmp(cargv[i], "--help") == 0 || strcmp(cargv[i], "-h") == 0) {
      command_help(desc, stdout);
      return EXIT_OK;
    }
  }
  if (strcmp(cmd, "help") == 0) {
    if (cargc == 0) {
      usage(stdout);
      return EXIT_OK;
    }
    const cmd_desc_t *d = find_command(cargv[0]);
    if (!d || cargc > 1) return usage_error("unknown command \"%s\"", cargv[0]);
    command_help(d, stdout);
    return EXIT_OK;
  }
  line_t line = {{0}, 0, false};
  int rc = build_line(cmd, cargc, cargv, &line);
  if (rc != 0) return rc;
  if (line.overflow) return usage_error("arguments too long");
  /* The daemon's own parser: a bad value is a usage error, said here. */
  tc_adm_cmd_t parsed;
  char err[512];
  if (tc_adm_parse(line.buf, line.len, &parsed, err, sizeof(err)) != 0) return usage_error("%s", err);
  bool all = parsed.kind == TC_ADM_STATS && cargc == 1;
  if (count && !watch_s) return usage_error("--count goes with --watch");
  /* Repeating a repair would repeat a change an operator meant once. */
  if (watch_s && (tc_adm_is_repair(parsed.kind) || parsed.kind == TC_ADM_FAILPOINT_ARM ||
                  parsed.kind == TC_ADM_FAILPOINT_LIST || parsed.kind == TC_ADM_HELP))
    return usage_error("--watch repeats listing commands only (globals, show, locks, history, nodes, stats), not \"%s\"",
                       cmd);

  char envbuf[256];
  if (!socket_path) socket_path = default_socket(envbuf, sizeof(envbuf));
  if (!socket_path)
    return usage_error("no admin socket: use --socket PATH or set TC_ADMIN_SOCKET (or TC_ADMIN_SOCKETS)");
  bool clear = watch_s && !as_json && isatty(STDOUT_FILENO);
  for (long round = 1;; round++) {
    if (watch_s && !as_json) {
      char when[64];
      time_t now = time(NULL);
      struct tm tm;
      strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
      if (clear) fputs("\033[H\033[2J", stdout);
      printf("every %gs: tcctl", watch_s);
      for (int i = optind; i < argc; i++) printf(" %s", argv[i]);
      printf("   (%s, %s)\n\n", socket_path, when);
    }
    rc = all ? stats_all(socket_path, timeout_s, as_json) : run_once(socket_path, &line, &parsed, timeout_s, as_json);
    fflush(stdout);
    if (!watch_s || (count && round >= count)) break;
    if (!clear && !as_json) printf("\n");
    sleep_seconds(watch_s);
  }
  return rc;
}
