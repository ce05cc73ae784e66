/*
 * rm_pg.c - libpq helpers every part of librmclient uses: the one place
 * that turns a libpq failure into a message, the SQLSTATE of a result, and
 * the check that a caller's connection can take a statement.  A leaf (the
 * public header and libpq only).
 */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "rm_pg.h"
#include "txc_pgconn.h"
#include "txc_pgmsg.h"

const char *rm__sqlstate(const PGresult *res) {
  const char *s = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  return s ? s : "";
}

void rm__pg_error(char *err, size_t errlen, const char *what, PGconn *pg, const PGresult *res) {
  const char *m = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  const char *d = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : NULL;
  if (!m) m = res ? PQresultErrorMessage(res) : NULL;
  if (!m || !*m) m = pg ? PQerrorMessage(pg) : "no connection";
  if (!m || !*m) m = "unknown error";
  size_t n = txc_pgmsg_len(m);
  if (d) snprintf(err, errlen, "%s: %.*s (%s)", what, (int)n, m, d);
  else snprintf(err, errlen, "%s: %.*s", what, (int)n, m);
}

const char *rm__pg_unusable(PGconn *pg, bool need_idle, int *code) {
  if (!pg || PQstatus(pg) != CONNECTION_OK) {
    *code = RM_E_INVALID;
    return "the PostgreSQL connection is not open";
  }
  PGTransactionStatusType ts = PQtransactionStatus(pg);
  if (ts == PQTRANS_INERROR || ts == PQTRANS_ACTIVE || ts == PQTRANS_UNKNOWN) {
    *code = RM_E_STATE;
    return "the PostgreSQL connection is in a failed or busy transaction";
  }
  if (need_idle && ts != PQTRANS_IDLE) {
    *code = RM_E_STATE;
    return "the PostgreSQL connection must not be inside a transaction block";
  }
  *code = 0;
  return NULL;
}

bool rm__pg_idle_usable(PGconn *pg) {
  return pg && PQtransactionStatus(pg) == PQTRANS_IDLE && txc_pgconn_usable(pg);
}

bool rm__pg_read_only_error(const PGresult *res) { return strcmp(rm__sqlstate(res), "25006") == 0; }

PGresult *rm__pg_io_exec(rm_pg_io_t *io, const char *what, const char *sql, int n, const char *const *params,
                         const Oid *types, ExecStatusType want) {
  io->sqlstate[0] = '\0';
  PGresult *res = PQexecParams(io->pg, sql, n, types, params, NULL, NULL, 0);
  if (PQresultStatus(res) == want) return res;
  rm__pg_error(io->err, io->errlen, what, io->pg, res);
  snprintf(io->sqlstate, sizeof(io->sqlstate), "%s", rm__sqlstate(res));
  /* A lost connection, or one on a standby (the next one goes to the
   * primary: the conninfo's target_session_attrs). */
  if (PQstatus(io->pg) != CONNECTION_OK || rm__pg_read_only_error(res)) io->bad = true;
  PQclear(res);
  return NULL;
}
