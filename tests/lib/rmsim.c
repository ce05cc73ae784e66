/*
 * rmsim.c - see rmsim.h.
 */
#include "rmsim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tcd_proc.h"
#include "txclient.h"
#include "txp_msg.h"

#define MAX_EVENTS 2048
#define MAX_PENDING 64
#define MAX_DIRTY 16
#define POLL_NS 10000000L /* 10 ms between two connection attempts or looks */

typedef struct event {
  int type; /* TXP_MSG_BRANCH_COMMIT / _ROLLBACK */
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t branch_id;
  int generation; /* which connection received it */
} event_t;

typedef struct pending {
  int type;
  uint64_t request_id;
  int64_t branch_id;
} pending_t;

struct rmsim {
  char client_id[128], resources[256], token[128];
  pthread_mutex_t mu;
  pthread_t thread;
  bool started; /* the thread: only the starting thread touches this */
  bool stop;
  int port;
  bool silent_commit, silent_rollback;
  int64_t dirty[MAX_DIRTY];
  int ndirty;
  int generation;
  int commits, rollbacks;
  pending_t pending[MAX_PENDING];
  int npending;
  event_t ev[MAX_EVENTS];
  int nev;
};

static void nap(void) {
  struct timespec ts = {0, POLL_NS};
  nanosleep(&ts, NULL);
}

rmsim_t *rmsim_new(const char *client_id, const char *resources, const char *token, int port) {
  rmsim_t *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  snprintf(r->client_id, sizeof(r->client_id), "%s", client_id);
  snprintf(r->resources, sizeof(r->resources), "%s", resources);
  snprintf(r->token, sizeof(r->token), "%s", token);
  r->port = port;
  pthread_mutex_init(&r->mu, NULL);
  return r;
}

void rmsim_free(rmsim_t *r) {
  if (!r) return;
  rmsim_stop(r);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

void rmsim_set_port(rmsim_t *r, int port) {
  pthread_mutex_lock(&r->mu);
  r->port = port;
  pthread_mutex_unlock(&r->mu);
}

/* ----------------------------------------------------------- the thread */

/* r->mu held. */
static bool is_dirty(const rmsim_t *r, int64_t branch) {
  for (int i = 0; i < r->ndirty; i++)
    if (r->dirty[i] == branch) return true;
  return false;
}

/* Fill the answer to a BranchCommit/Rollback of 'branch'; r->mu held. A
 * dirty branch fails for good: its rollback meets a dirty write, its
 * commit an unretryable error. */
static void fill_answer(const rmsim_t *r, int type, int64_t branch, txp_msg_t *res) {
  if (type == TXP_MSG_BRANCH_ROLLBACK && is_dirty(r, branch)) {
    txp_msg_set_int(res, TXP_F_CODE, TXP_EDIRTY_WRITE);
    txp_msg_set_str(res, TXP_F_MESSAGE, "dirty write: row changed since the branch ran");
    return;
  }
  if (type == TXP_MSG_BRANCH_COMMIT && is_dirty(r, branch)) {
    txp_msg_set_int(res, TXP_F_CODE, TXP_EBRANCH_UNRETRYABLE);
    txp_msg_set_str(res, TXP_F_MESSAGE, "undo log unreadable");
    return;
  }
  txp_msg_set_int(res, TXP_F_BRANCH_STATUS, txc_phase2_done(type));
}

static int handler(txc_t *c, const txp_msg_t *req, txp_msg_t *res, void *arg) {
  rmsim_t *r = arg;
  (void)c;
  int type = req->type;
  if (type != TXP_MSG_BRANCH_COMMIT && type != TXP_MSG_BRANCH_ROLLBACK) return 0;
  pthread_mutex_lock(&r->mu);
  if (type == TXP_MSG_BRANCH_COMMIT) r->commits++;
  else r->rollbacks++;
  if (r->nev < MAX_EVENTS) {
    event_t *e = &r->ev[r->nev++];
    e->type = type;
    snprintf(e->xid, sizeof(e->xid), "%s", req->xid ? req->xid : "");
    e->branch_id = req->branch_id;
    e->generation = r->generation;
  }
  bool silent = type == TXP_MSG_BRANCH_COMMIT ? r->silent_commit : r->silent_rollback;
  int rc = 0;
  if (silent) {
    if (r->npending < MAX_PENDING) {
      pending_t *p = &r->pending[r->npending++];
      p->type = type;
      p->request_id = req->request_id;
      p->branch_id = req->branch_id;
    }
    rc = 1;
  } else {
    fill_answer(r, type, req->branch_id, res);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* Answer held requests whose mode is no longer silent.  -1 if the
 * connection broke. */
static int answer_pending(rmsim_t *r, txc_t *c) {
  txp_buf_t out;
  txp_buf_init(&out, 0);
  pthread_mutex_lock(&r->mu);
  int keep = 0;
  for (int i = 0; i < r->npending; i++) {
    pending_t p = r->pending[i];
    bool silent = p.type == TXP_MSG_BRANCH_COMMIT ? r->silent_commit : r->silent_rollback;
    if (silent) {
      r->pending[keep++] = p;
      continue;
    }
    txp_msg_t req, res;
    txp_msg_init(&req, (txp_msg_type_t)p.type);
    req.request_id = p.request_id;
    txp_msg_init_result(&res, &req, 0, NULL);
    fill_answer(r, p.type, p.branch_id, &res);
    txp_encode(&res, &out, 0);
  }
  r->npending = keep;
  pthread_mutex_unlock(&r->mu);
  int rc = out.len ? txc_send_raw(c, out.data, out.len) : 0;
  txp_buf_free(&out);
  return rc == 0 ? 0 : -1;
}

static void *rm_main(void *arg) {
  rmsim_t *r = arg;
  txc_t *c = NULL;
  double next_beat = 0;
  for (;;) {
    pthread_mutex_lock(&r->mu);
    bool stop = r->stop;
    int port = r->port;
    pthread_mutex_unlock(&r->mu);
    if (stop) break;
    if (!c) {
      char err[256];
      c = txc_connect(TCD_PROC_HOST, port, 500, err, sizeof(err));
      if (c && txc_register(c, true, "test-rm", r->client_id, r->token, r->resources) != 0) {
        txc_close(c);
        c = NULL;
      }
      if (!c) {
        nap();
        continue;
      }
      txc_set_handler(c, handler, r);
      pthread_mutex_lock(&r->mu);
      r->generation++;
      r->npending = 0; /* held requests of the old connection died with it */
      pthread_mutex_unlock(&r->mu);
      next_beat = txc_now_ms() + 1000;
    }
    int rc = answer_pending(r, c) == 0 ? txc_poll(c, 20, false) : TXP_ECONN_LOST;
    if (rc >= 0 && txc_now_ms() >= next_beat) {
      txp_msg_t hb, res;
      txp_msg_init(&hb, TXP_MSG_HEARTBEAT);
      rc = txc_call(c, &hb, &res, 3000);
      txp_msg_clear(&res);
      if (rc == TXP_EUNKNOWN_OUTCOME) rc = 0; /* a slow answer is not a lost connection */
      next_beat = txc_now_ms() + 1000;
    }
    if (rc < 0) {
      txc_close(c);
      c = NULL;
      pthread_mutex_lock(&r->mu);
      r->npending = 0;
      pthread_mutex_unlock(&r->mu);
    }
  }
  txc_close(c);
  return NULL;
}

/* ------------------------------------------------------------- control */

int rmsim_start(rmsim_t *r, int timeout_ms) {
  if (!r->started) {
    pthread_mutex_lock(&r->mu);
    r->stop = false;
    pthread_mutex_unlock(&r->mu);
    int gen = rmsim_generation(r);
    if (pthread_create(&r->thread, NULL, rm_main, r) != 0) return -1;
    r->started = true;
    double deadline = txc_now_ms() + timeout_ms;
    while (rmsim_generation(r) <= gen) {
      if (txc_now_ms() > deadline) return -1;
      nap();
    }
  }
  return 0;
}

void rmsim_stop(rmsim_t *r) {
  if (!r->started) return;
  pthread_mutex_lock(&r->mu);
  r->stop = true;
  pthread_mutex_unlock(&r->mu);
  pthread_join(r->thread, NULL);
  r->started = false;
}

void rmsim_modes(rmsim_t *r, bool silent_commit, bool silent_rollback) {
  pthread_mutex_lock(&r->mu);
  r->silent_commit = silent_commit;
  r->silent_rollback = silent_rollback;
  pthread_mutex_unlock(&r->mu);
}

void rmsim_dirty(rmsim_t *r, int64_t branch) {
  pthread_mutex_lock(&r->mu);
  if (branch == 0) r->ndirty = 0;
  else if (r->ndirty < MAX_DIRTY) r->dirty[r->ndirty++] = branch;
  pthread_mutex_unlock(&r->mu);
}

int rmsim_generation(rmsim_t *r) {
  pthread_mutex_lock(&r->mu);
  int g = r->generation;
  pthread_mutex_unlock(&r->mu);
  return g;
}

int rmsim_count(rmsim_t *r, bool commits) {
  pthread_mutex_lock(&r->mu);
  int n = commits ? r->commits : r->rollbacks;
  pthread_mutex_unlock(&r->mu);
  return n;
}

int rmsim_events(rmsim_t *r, const char *xid, int type, int after_gen, int64_t *ids, int max) {
  int n = 0;
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->nev; i++) {
    const event_t *e = &r->ev[i];
    if (e->type != type || e->generation <= after_gen || strcmp(e->xid, xid) != 0) continue;
    if (ids && n < max) ids[n] = e->branch_id;
    n++;
  }
  pthread_mutex_unlock(&r->mu);
  return n;
}
