/*
 * pgstat.h - the server-side counters of a PostgreSQL server that do not
 * depend on the machine, sampled at both ends of a measured period: WAL
 * (bytes, records, full-page images, fsyncs; pg_stat_wal, the whole
 * server), and per database the transactions and the rows read by scans
 * (pg_stat_database) and the
 * top-level statements (pg_stat_statements; the servers scripts/pg-tmp
 * starts load it).  Shared by order-load's budget (budget.h) and tc-bench.
 *
 * NOTES
 *   One short connection per sample, on 'url'; the sample's own few
 *   statements are counted too (noise below 0.01 per transaction at the
 *   benchmarks' sizes).  CREATE EXTENSION pg_stat_statements is run in the
 *   sampled database once (it needs the right to create it; without it, or
 *   without the library loaded, statements are -1: unknown, never 0).
 */
#ifndef PGSTAT_H
#define PGSTAT_H

#include <stdbool.h>

#define PGSTAT_MAX_DB 6

typedef struct pgstat {
  bool ok;                                 /* the WAL figures were read */
  long long wal_records, wal_fpi, wal_bytes, wal_sync;
  int ndb;
  char db[PGSTAT_MAX_DB][64];              /* database names */
  long long xacts[PGSTAT_MAX_DB];          /* commits + rollbacks; -1 unknown */
  long long rows_read[PGSTAT_MAX_DB];      /* tup_returned: rows a scan visited and returned
                                              (a sequential scan counts every live row it
                                              read, an index scan the entries it returned);
                                              -1 unknown */
  long long statements[PGSTAT_MAX_DB];     /* pg_stat_statements calls; -1 unknown */
} pgstat_t;

/* Adds the database a conninfo (URL or key=value) names to out->db, once;
 * NULL or a conninfo without dbname is ignored. */
void pgstat_add_db(pgstat_t *out, const char *conninfo);

/* Samples the server 'url' reaches, for the databases already added. */
void pgstat_sample(pgstat_t *out, const char *url);

#endif
