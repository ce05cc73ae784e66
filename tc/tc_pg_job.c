/*
 * tc_pg_job.c - the job object of the PostgreSQL pool (tc_pg.h): building
 * a job's statements, its errors and results, and its end.  The pool and
 * its connections are in tc_pg.c.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_pg.h"
#include "tc_pg_int.h"
#include "txc_pgmsg.h"

/* Copy 'src' into 'dst' ('len' bytes), dropping the trailing newlines and
 * spaces libpq puts at the end of its messages. */
void tc__pg_copy_msg(char *dst, size_t len, const char *src)
{
  size_t n;

  if (src == NULL)
    src = "";
  n = txc_pgmsg_len(src);
  if (n >= len)
    n = len - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* ---- jobs: errors and lifetime ---- */

/* Record the job's first error; later ones are ignored.  'msg' is trimmed;
 * if it cannot be copied the job reports "" (the status still says what
 * happened). */
void tc__pg_job_set_error(tc_pg_job_t *job, const char *msg, const char *sqlstate, int index)
{
  char buf[1024];
  size_t n;

  if (job->has_error)
    return;
  job->has_error = true;
  job->failed_index = index;
  tc__pg_copy_msg(buf, sizeof buf, msg);
  n = strlen(buf);
  job->errmsg = malloc(n + 1);
  if (job->errmsg != NULL)
    memcpy(job->errmsg, buf, n + 1);
  tc__pg_copy_msg(job->sqlstate, sizeof job->sqlstate, sqlstate);
}

void tc__pg_job_set_error_from_result(tc_pg_job_t *job, const PGresult *res, int index)
{
  const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

  if (msg == NULL)
    msg = PQresultErrorMessage(res);
  tc__pg_job_set_error(job, msg, state, index);
}

/* Run the job's callback once and free the job.  The caller has already
 * detached the job from every pool structure. */
void tc__pg_job_complete(tc_pg_job_t *job, int status)
{
  job->done_ns = uv_hrtime();
  if (job->cb != NULL)
    job->cb(job, status, job->arg);
  tc_pg_job_free(job);
}

/* ---- job API ---- */

tc_pg_job_t *tc_pg_job_new(unsigned flags, tc_pg_job_cb cb, void *arg)
{
  tc_pg_job_t *job = calloc(1, sizeof *job);

  if (job == NULL)
    return NULL;
  job->flags = flags;
  job->cb = cb;
  job->arg = arg;
  txc_heap_node_init(&job->hnode);
  job->failed_index = -1;
  return job;
}

int tc_pg_job_add(tc_pg_job_t *job, const char *sql, int nparams, const char *const *values)
{
  tc_pg_stmt_t *s;
  size_t size, off;
  char *p;
  int i;

  if (job == NULL || sql == NULL || nparams < 0 || nparams > TC_PG_MAX_PARAMS ||
      (nparams > 0 && values == NULL))
    return -1;
  if (job->nstmts == job->cap) {
    int cap;
    tc_pg_stmt_t *stmts;

    if (job->cap > INT_MAX / 2)
      return -1;
    cap = job->cap ? job->cap * 2 : 4;
    stmts = realloc(job->stmts, (size_t)cap * sizeof *stmts);
    if (stmts == NULL)
      return -1;
    job->stmts = stmts;
    job->cap = cap;
  }

  /* One block: the value pointers, then the SQL, then each value. */
  off = (size_t)nparams * sizeof(char *);
  size = off + strlen(sql) + 1;
  for (i = 0; i < nparams; i++)
    if (values[i] != NULL)
      size += strlen(values[i]) + 1;
  s = &job->stmts[job->nstmts];
  memset(s, 0, sizeof *s);
  s->block = malloc(size);
  if (s->block == NULL)
    return -1;
  s->values = nparams > 0 ? s->block : NULL;
  s->nparams = nparams;
  p = (char *)s->block + off;
  s->sql = p;
  p = stpcpy(p, sql) + 1;
  for (i = 0; i < nparams; i++) {
    if (values[i] == NULL) {
      s->values[i] = NULL;
    } else {
      s->values[i] = p;
      p = stpcpy(p, values[i]) + 1;
    }
  }
  job->nstmts++;
  return 0;
}

int tc_pg_job_add_prepared(tc_pg_job_t *job, const char *name, const char *sql, int nparams,
                           const char *const *values)
{
  if (name == NULL || name[0] == '\0')
    return -1;
  if (tc_pg_job_add(job, sql, nparams, values) != 0)
    return -1;
  job->stmts[job->nstmts - 1].name = name;
  return 0;
}

int tc_pg_job_count(const tc_pg_job_t *job)
{
  return job != NULL ? job->nstmts : 0;
}


void tc_pg_job_free(tc_pg_job_t *job)
{
  int i;

  if (job == NULL)
    return;
  for (i = 0; i < job->nstmts; i++) {
    if (job->stmts[i].res != NULL)
      PQclear(job->stmts[i].res);
    free(job->stmts[i].block);
  }
  free(job->stmts);
  free(job->items);
  free(job->errmsg);
  free(job);
}

const PGresult *tc_pg_job_result(const tc_pg_job_t *job, int i)
{
  if (job == NULL || i < 0 || i >= job->nstmts)
    return NULL;
  return job->stmts[i].res;
}

const char *tc_pg_job_error(const tc_pg_job_t *job)
{
  return job != NULL && job->errmsg != NULL ? job->errmsg : "";
}

const char *tc_pg_job_sqlstate(const tc_pg_job_t *job)
{
  return job != NULL ? job->sqlstate : "";
}

int tc_pg_job_failed_index(const tc_pg_job_t *job)
{
  return job != NULL ? job->failed_index : -1;
}

double tc_pg_job_elapsed_ms(const tc_pg_job_t *job)
{
  uint64_t end;

  if (job == NULL || job->submit_ns == 0)
    return 0.0;
  end = job->done_ns != 0 ? job->done_ns : uv_hrtime();
  return (double)(end - job->submit_ns) / 1e6;
}
