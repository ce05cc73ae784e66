/*
 * transfer.c - one global transaction over two databases with librmclient
 * (AT mode): debit account 1 by 10.50 in "bank", add a ledger row in
 * "ledger".  README.md, "Using librmclient", explains every line.
 *
 *   transfer commit | rollback   commit it, or roll it back at the end
 *   transfer crash               exit before the decision: the timeout (5 s)
 *                                rolls it back, once an RM of both runs
 *   transfer serve [SECONDS]     only be that RM (phase two), default 30 s
 * Environment: TC_NODES, TC_TOKEN, BANK_PG_URL, LEDGER_PG_URL.
 */
#include <libpq-fe.h>
#include <rm_client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *env(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) fprintf(stderr, "transfer: set %s\n", name), exit(2);
  return v;
}

/* One branch in its own local transaction: BEGIN, open, one statement
 * (the SQL you would write anyway: librmclient takes its images), prepare
 * (registers the branch, writes the undo row), COMMIT, close. */
static int branch(rm_client_t *c, const char *xid, const char *resource, PGconn *pg, bool debit) {
  const char *acct[] = {"1"}, *row[] = {"1", "-10.50", xid};
  rm_branch_t *b;
  int64_t rows = 0;
  PQclear(PQexec(pg, "BEGIN"));
  int rc = rm_at_open(c, xid, resource, pg, &b);
  if (rc != 0) return PQclear(PQexec(pg, "ROLLBACK")), rc;
  rc = debit ? rm_at_sql(b, "UPDATE account SET balance = balance - 10.50 WHERE id = $1 AND balance >= 10.50", 1,
                         NULL, acct, &rows, NULL)
             : rm_at_sql(b, "INSERT INTO ledger (account_id, amount, memo) VALUES ($1, $2, $3)", 3, NULL, row, &rows,
                         NULL);
  if (rc == 0 && rows != 1) rc = RM_E_GUARD; /* no such account, or not 10.50 on it */
  if (rc == 0) rc = rm_at_prepare(b, NULL);
  PGresult *r = PQexec(pg, rc == 0 ? "COMMIT" : "ROLLBACK");
  if (rc == 0 && PQresultStatus(r) != PGRES_COMMAND_OK) rc = RM_E_DB;
  PQclear(r);
  rm_at_close(b, rc == 0);
  return rc;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "commit";
  rm_config_t cfg = {.nodes = env("TC_NODES"), .token = env("TC_TOKEN"), .application_id = "transfer",
                     .log_cb = rm_log_stderr, .log_arg = "transfer"};
  rm_client_t *c = NULL;
  if (rm_client_new(&cfg, &c) != 0 || rm_resource_add(c, "bank", env("BANK_PG_URL")) != 0 ||
      rm_resource_add(c, "ledger", env("LEDGER_PG_URL")) != 0)
    return fprintf(stderr, "transfer: %s\n", rm_errmsg()), rm_client_free(c), 1;
  if (strcmp(mode, "serve") == 0) return sleep(argc > 2 ? atoi(argv[2]) : 30), rm_client_free(c), 0;

  PGconn *bank = PQconnectdb(env("BANK_PG_URL")), *ledger = PQconnectdb(env("LEDGER_PG_URL"));
  char xid[RM_XID_MAX];
  int st = 0, rc = rm_tm_begin(c, strcmp(mode, "crash") == 0 ? 5000 : 0, "transfer", xid);
  if (rc == 0 && (rc = branch(c, xid, "bank", bank, true)) == 0) rc = branch(c, xid, "ledger", ledger, false);
  if (rc != 0) fprintf(stderr, "transfer: %s\n", rm_errmsg());
  if (rc == 0 && strcmp(mode, "crash") == 0) printf("%s crashing\n", xid), fflush(stdout), _exit(3);
  if (rc == 0 && strcmp(mode, "commit") == 0) {
    if ((rc = rm_tm_commit(c, xid, &st)) != 0) fprintf(stderr, "transfer: %s\n", rm_errmsg());
  } else if (xid[0]) { /* roll back on request, or because a branch failed */
    int rrc = rm_tm_rollback(c, xid, &st);
    if (rrc != 0) fprintf(stderr, "transfer: %s\n", rm_errmsg()), rc = rrc;
  }
  printf("%s %s %s\n", xid, rm_global_status_name(st), rc == 0 ? "ok" : rm_strerror(rc));
  PQfinish(bank);
  PQfinish(ledger);
  rm_client_free(c);
  return rc == 0 ? 0 : 1;
}
