/*
 * rm_fence_run.c - one phase two behind the fence, with the mode's
 * handler (rm_fence.h): TCC's confirm and cancel, a saga step's action
 * and compensation.
 *
 * NOTES
 *   One local transaction: lock the row (FOR UPDATE; a second delivery of
 *   the same call waits and then finds the row set), let the rules
 *   decide, run the handler on the same connection, set the row, commit.
 *   The handler's database change and the fence row commit together or
 *   not at all.
 *
 *   A row that is not there cannot be locked.  Recording an empty
 *   rollback inserts it (ON CONFLICT DO NOTHING): when a phase one or a
 *   saga action inserted it meanwhile, the insert waits for that
 *   transaction on the key and then finds the row, and the rules decide
 *   again on it.  A saga action that runs with no row inserts it first, in
 *   the same way: a compensation recorded meanwhile refuses the action.
 */
#include <stdio.h>
#include <stdlib.h>

#include "rm_client.h"
#include "rm_fence.h"
#include "txp_status.h"

/* Run the handler inside the transaction: 0, or the branch status of its
 * failure with *code set. */
static int run_handler(rm_pg_io_t *io, const rm_fence_job_t *job, const char *args, int retry, int never,
                       int *code) {
  rm_tcc_call_t call = {.xid = job->xid, .branch_id = job->branch_id, .resource_id = job->resource_id,
                        .args = args, .pg = io->pg};
  char herr[512] = "";
  int hrc = job->handler(&call, job->handler_arg, herr, sizeof(herr));
  *code = RM_E_TCC_HANDLER;
  if (hrc == RM_TCC_OK) {
    if (PQtransactionStatus(io->pg) == PQTRANS_INTRANS) return 0;
    /* Its transaction was ended or broken: the fence row cannot be written
     * with the change, so nothing is recorded and the handler runs again. */
    snprintf(io->err, io->errlen,
             "the %s %s handler of \"%s\" returned OK but left its transaction %s (a handler must not COMMIT, "
             "ROLLBACK or leave a failed statement): retried",
             job->mode, job->what, job->resource_id,
             PQtransactionStatus(io->pg) == PQTRANS_INERROR ? "failed" : "ended");
    return retry;
  }
  snprintf(io->err, io->errlen, "the %s %s handler of \"%s\" %s: %s", job->mode, job->what, job->resource_id,
           hrc == RM_TCC_FAILED ? "failed for good" : "asked for a retry", herr[0] ? herr : "(no message)");
  return hrc == RM_TCC_FAILED ? never : retry;
}

/* Decide on the row and, where the row is missing, put it there first
 * (RECORD: the empty rollback; RUN: a saga action's), deciding again when
 * another transaction's row turns out to be there. */
static int decide(rm_pg_io_t *io, const rm_fence_job_t *job, int *found, char **row_args,
                  rm_fence_action_t *act, int *to, const char **why) {
  if (rm_fence_lock(io, job->xid, job->branch_id, found, row_args) != 0) return -1;
  *act = job->rules(job->commit, *found, to, why);
  if (*found != RM_FENCE_NONE || (*act != RM_FENCE_RECORD && *act != RM_FENCE_RUN)) return 0;
  bool inserted;
  int there = RM_FENCE_NONE;
  if (*act == RM_FENCE_RECORD) {
    if (rm_fence_record_empty(io, job->xid, job->branch_id, job->resource_id, job->branch_type, &inserted) != 0)
      return -1;
  } else {
    if (rm_fence_insert(io, job->xid, job->branch_id, job->resource_id, job->branch_type, job->args, &there) != 0)
      return -1;
    inserted = there == RM_FENCE_NONE;
  }
  if (inserted) return 0;
  free(*row_args);
  *row_args = NULL;
  if (rm_fence_lock(io, job->xid, job->branch_id, found, row_args) != 0) return -1;
  *act = job->rules(job->commit, *found, to, why);
  if (*found == RM_FENCE_NONE) { /* cannot be: the insert met a row */
    snprintf(io->err, io->errlen, "the fence row of the branch appeared and vanished: retried");
    return -1;
  }
  return 0;
}

static int fenced(rm_pg_io_t *io, const rm_fence_job_t *job, int *code, bool *empty) {
  int ok = job->commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  int retry = job->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int never = job->commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  *code = RM_E_DB;
  char begin_what[64];
  snprintf(begin_what, sizeof(begin_what), "could not begin the %s phase-two transaction", job->mode);
  if (rm_fence_command(io, "BEGIN", begin_what) != 0) return retry;
  int found, to, status = retry;
  char *row_args = NULL;
  const char *why = NULL;
  rm_fence_action_t act;
  if (decide(io, job, &found, &row_args, &act, &to, &why) != 0) goto out;
  switch (act) {
  case RM_FENCE_DONE:
    status = ok; /* a duplicate: answered from the row; the ROLLBACK after changes nothing */
    goto out;
  case RM_FENCE_RETRY:
  case RM_FENCE_REFUSE:
    *code = act == RM_FENCE_RETRY ? RM_E_STATE : RM_E_FENCE;
    snprintf(io->err, io->errlen, "%s", why);
    status = act == RM_FENCE_RETRY ? retry : never;
    goto out;
  case RM_FENCE_RUN: {
    int hs = run_handler(io, job, job->args ? job->args : row_args, retry, never, code);
    if (hs != 0) {
      status = hs;
      goto out;
    }
    *code = RM_E_DB;
    if (rm_fence_set(io, job->xid, job->branch_id, to) != 0) goto out;
    break;
  }
  case RM_FENCE_RECORD: break; /* the row went in when deciding */
  }
  char commit_what[64];
  snprintf(commit_what, sizeof(commit_what), "could not commit the %s phase-two transaction", job->mode);
  if (rm_fence_command(io, "COMMIT", commit_what) != 0) goto out;
  if (empty) *empty = act == RM_FENCE_RECORD;
  *code = 0;
  status = ok;
out:
  free(row_args);
  return status;
}

int rm_fence_run(rm_pg_io_t *io, const rm_fence_job_t *job, int *code, bool *empty) {
  if (empty) *empty = false;
  int status = fenced(io, job, code, empty);
  if (PQtransactionStatus(io->pg) != PQTRANS_IDLE) {
    PGresult *rb = PQexec(io->pg, "ROLLBACK");
    if (PQresultStatus(rb) != PGRES_COMMAND_OK) io->bad = true;
    PQclear(rb);
  }
  return status;
}
