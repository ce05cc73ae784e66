/*
 * txc_pstmt.c - the prepared-statement cache declared in txc_pstmt.h.
 */
#include "txc_pstmt.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "txc_fnv.h"

typedef struct {
  uint64_t hash; /* of the text, the parameter count and types */
  char *sql;
  int n;
  Oid *types; /* NULL when untyped */
  unsigned id;
} pstmt_t;

typedef struct {
  PGconn *pg; /* NULL: free slot */
  int pid;
  uint64_t last_use;
  int nstmts;
  pstmt_t stmts[TXC_PSTMT_PER_CONN];
} pconn_t;

struct txc_pstmt_cache {
  pthread_mutex_t mu;
  char prefix[TXC_PSTMT_PREFIX_MAX + 1];
  unsigned next_id;
  uint64_t tick;
  int nconns;
  pconn_t *conns;
};

txc_pstmt_cache_t *txc_pstmt_new(const char *prefix, int conns) {
  size_t len = prefix ? strlen(prefix) : 0;
  if (len == 0 || len > TXC_PSTMT_PREFIX_MAX || strspn(prefix, "abcdefghijklmnopqrstuvwxyz"
                                                                "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != len ||
      conns < 1)
    return NULL;
  txc_pstmt_cache_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  if (!(c->conns = calloc((size_t)conns, sizeof(pconn_t)))) {
    free(c);
    return NULL;
  }
  c->nconns = conns;
  memcpy(c->prefix, prefix, len + 1);
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

static void conn_clear(pconn_t *pc) {
  for (int i = 0; i < pc->nstmts; i++) {
    free(pc->stmts[i].sql);
    free(pc->stmts[i].types);
  }
  memset(pc, 0, sizeof(*pc));
}

void txc_pstmt_free(txc_pstmt_cache_t *c) {
  if (!c) return;
  for (int i = 0; i < c->nconns; i++) conn_clear(&c->conns[i]);
  pthread_mutex_destroy(&c->mu);
  free(c->conns);
  free(c);
}

static uint64_t stmt_hash(const char *sql, int n, const Oid *types) {
  uint64_t h = txc_fnv1a_str(TXC_FNV_OFFSET, sql);
  h = txc_fnv1a(h, &n, sizeof(n));
  if (types) h = txc_fnv1a(h, types, (size_t)n * sizeof(Oid));
  return h;
}

static bool same_stmt(const pstmt_t *s, uint64_t h, const char *sql, int n, const Oid *types) {
  if (s->hash != h || s->n != n || strcmp(s->sql, sql) != 0) return false;
  if (!s->types || !types) return !s->types && !types;
  return memcmp(s->types, types, (size_t)n * sizeof(Oid)) == 0;
}

/* The slot of 'pg' (emptied if its backend changed), or NULL; with
 * 'create', a free or the least recently used slot is taken for it. */
static pconn_t *conn_slot(txc_pstmt_cache_t *c, PGconn *pg, bool create) {
  int pid = PQbackendPID(pg);
  pconn_t *victim = NULL;
  for (int i = 0; i < c->nconns; i++) {
    pconn_t *pc = &c->conns[i];
    if (pc->pg == pg) {
      if (pc->pid != pid) { /* reconnected: nothing is prepared there */
        conn_clear(pc);
        if (!create) return NULL;
        pc->pg = pg;
        pc->pid = pid;
      }
      pc->last_use = ++c->tick;
      return pc;
    }
    if (!victim || (victim->pg && (!pc->pg || pc->last_use < victim->last_use))) victim = pc;
  }
  if (!create || !victim) return NULL;
  conn_clear(victim);
  victim->pg = pg;
  victim->pid = pid;
  victim->last_use = ++c->tick;
  return victim;
}

static void format_name(const txc_pstmt_cache_t *c, char name[TXC_PSTMT_NAME_MAX], unsigned id) {
  snprintf(name, TXC_PSTMT_NAME_MAX, "%s%u", c->prefix, id);
}

bool txc_pstmt_lookup(txc_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const Oid *types,
                      char name[TXC_PSTMT_NAME_MAX], bool *fresh) {
  if (!c || !pg || PQbackendPID(pg) == 0) return false;
  if (n == 0) types = NULL;
  uint64_t h = stmt_hash(sql, n, types);
  bool found = false, room = true;
  unsigned id = 0;
  pthread_mutex_lock(&c->mu);
  pconn_t *pc = conn_slot(c, pg, false);
  if (pc) {
    for (int i = 0; i < pc->nstmts && !found; i++) {
      if (same_stmt(&pc->stmts[i], h, sql, n, types)) {
        found = true;
        id = pc->stmts[i].id;
      }
    }
    room = pc->nstmts < TXC_PSTMT_PER_CONN;
  }
  if (!found && room) id = ++c->next_id;
  pthread_mutex_unlock(&c->mu);
  if (!found && !room) return false;
  format_name(c, name, id);
  *fresh = !found;
  return true;
}

void txc_pstmt_prepared(txc_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const Oid *types,
                        const char *name, bool ok) {
  if (!c || !ok) return;
  if (n == 0) types = NULL;
  size_t plen = strlen(c->prefix);
  unsigned id = 0;
  if (strncmp(name, c->prefix, plen) != 0 || sscanf(name + plen, "%u", &id) != 1) return;
  char *copy = strdup(sql);
  Oid *tcopy = types && n > 0 ? malloc((size_t)n * sizeof(Oid)) : NULL;
  if (!copy || (types && n > 0 && !tcopy)) { /* not remembered: the text goes unnamed next time */
    free(copy);
    free(tcopy);
    return;
  }
  if (tcopy) memcpy(tcopy, types, (size_t)n * sizeof(Oid));
  pthread_mutex_lock(&c->mu);
  pconn_t *pc = conn_slot(c, pg, true);
  if (pc && pc->nstmts < TXC_PSTMT_PER_CONN) {
    pc->stmts[pc->nstmts++] = (pstmt_t){stmt_hash(sql, n, types), copy, n, tcopy, id};
    copy = NULL;
    tcopy = NULL;
  }
  pthread_mutex_unlock(&c->mu);
  free(copy);
  free(tcopy);
}

void txc_pstmt_forget(txc_pstmt_cache_t *c, PGconn *pg) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->nconns; i++)
    if (c->conns[i].pg == pg) conn_clear(&c->conns[i]);
  pthread_mutex_unlock(&c->mu);
}

bool txc_pstmt_stale(const PGresult *r) {
  const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  return st && (strcmp(st, "26000") == 0 || strcmp(st, "0A000") == 0);
}

PGresult *txc_pstmt_exec(txc_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const char *const *params) {
  char name[TXC_PSTMT_NAME_MAX];
  bool fresh = false;
  if (n <= 0 || !txc_pstmt_lookup(c, pg, sql, n, NULL, name, &fresh))
    return PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
  if (fresh) {
    PGresult *p = PQprepare(pg, name, sql, n, NULL);
    bool ok = p && PQresultStatus(p) == PGRES_COMMAND_OK;
    txc_pstmt_prepared(c, pg, sql, n, NULL, name, ok);
    if (!ok) return p; /* the statement's own error (or NULL: out of memory) */
    PQclear(p);
  }
  PGresult *r = PQexecPrepared(pg, name, n, params, NULL, NULL, 0);
  if (r && txc_pstmt_stale(r)) {
    txc_pstmt_forget(c, pg);
    /* outside a transaction nothing was aborted: run it as it is */
    if (PQtransactionStatus(pg) == PQTRANS_IDLE) {
      PQclear(r);
      r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
    }
  }
  return r;
}
