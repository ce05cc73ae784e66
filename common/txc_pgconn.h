/*
 * txc_pgconn.h - whether an idle libpq connection can still take work: the
 * one check that librmclient's pools and the demo services' pool make
 * before lending a connection after a server restart or a failover.
 * Header only, like txc_pgmsg.h (tc, librmclient and the services include
 * it; none links the others).
 */
#ifndef TXC_PGCONN_H
#define TXC_PGCONN_H

#include <poll.h>
#include <stdbool.h>
#include <string.h>

#include <libpq-fe.h>

/* Whether 'pg' is open, out of pipeline mode and not on a read-only
 * server.  What the server sent meanwhile is read without blocking, so a
 * connection that died or was cut by a failover shows now, not as the
 * next statement's error: a server that goes away says so first (FATAL
 * "terminating connection ..."), then closes, and only the next read
 * meets the end of the stream, hence several reads (PQconsumeInput never
 * blocks).  A hot standby would refuse every write with SQLSTATE 25006;
 * PostgreSQL 14 and later report in_hot_standby and
 * default_transaction_read_only to the client. */
static inline bool txc_pgconn_usable(PGconn *pg) {
  if (!pg || PQstatus(pg) != CONNECTION_OK) return false;
  /* a pipeline its user could not finish (the connection broke while it
   * sent or read) holds results nobody will read */
  if (PQpipelineStatus(pg) != PQ_PIPELINE_OFF) return false;
  struct pollfd pfd = {.fd = PQsocket(pg), .events = POLLIN};
  if (pfd.fd < 0) return false;
  for (int i = 0; i < 4 && poll(&pfd, 1, 0) != 0; i++)
    if (!PQconsumeInput(pg) || PQstatus(pg) != CONNECTION_OK) return false;
  const char *hs = PQparameterStatus(pg, "in_hot_standby");
  const char *ro = PQparameterStatus(pg, "default_transaction_read_only");
  return !(hs && strcmp(hs, "on") == 0) && !(ro && strcmp(ro, "on") == 0);
}

#endif /* TXC_PGCONN_H */
