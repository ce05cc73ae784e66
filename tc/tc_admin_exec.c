/*
 * tc_admin_exec.c - what each admin command does, and the JSON it answers.
 *
 * NOTES
 *   Reads go through the store's named reads (tc_store_read.h: their SQL
 *   is there), which run on the reader connections, never on the
 *   group-commit writers, so an operator's query cannot delay a commit
 *   batch.  This file turns their rows into answers ({"ok":true,...}):
 *
 *     show globals  {"globals":[G...],"count":n,"truncated":b}
 *     show global   {"global":G|H|null,"branches":[B...],"locks":[L...],
 *                    "waiters":[W...]}          (H: finished, from history)
 *     show locks    {"locks":[L...],"count":n,"truncated":b,
 *                    "waiters":[{"holder":xid,"queue":[W...]}]}
 *     show history  {"history":[F...],"count":n,"truncated":b}
 *     show nodes    {"self":{...},"nodes":[N...]}
 *     stats         {"node":{...},"globals":{...},"locks":{...},...,
 *                    "sessions":{"Begin":n,...}}
 *     repairs       {"xid":x,"action":a,"from":S,"to":S[,"status":S,
 *                    "finished":b]}  ("status": where phase two got to)
 *     delete        {"xid":x,"action":"delete","deleted":{"locks":n,
 *                    "branches":n},"history_status":S|null}
 *   where G = {"xid","transaction_id","status","status_code","name",
 *   "application_id","node_id","begin_time","age_s","timeout_ms",
 *   "deadline","retry_count","next_retry_at","last_error","branches",
 *   "locks","live":true}, B = {"branch_id","resource_id","branch_type",
 *   "status","status_code","client_id","retry_count","next_retry_at",
 *   "last_error","lock_keys","application_data","created","modified"},
 *   L = {"row_key","xid","branch_id","resource_id","table","pk","status"
 *   ("locked"|"rollbacking"),"since","holder_status","orphan"},
 *   W = {"xid","waiting_ms","timeout_in_ms"}, F = {"xid","transaction_id",
 *   "status","status_code","name","application_id","begin_time",
 *   "end_time","duration_s","branches","live":false}.  Timestamps are ISO
 *   8601 UTC.
 *
 *   Repairs: read the stored state, plan with tc_adm_plan_repair (pure,
 *   checked against txp_global_transition_ok), then apply: a decision from
 *   Begin is the store's own DECIDE op (the TM's path: same lock handling,
 *   same counters); anything else is tc_read_admin_cas (tc_admin_cas(),
 *   sql/tc/004_admin.sql), a compare-and-set under the global row lock that also re-checks the
 *   forbidden branch statuses.  A re-drive then runs phase two on this node
 *   (tc__phase2_drive) and answers when it ends.  Every repair that changes
 *   something is logged at warn level with the operator's uid; a refused
 *   one at info.
 *
 *   Thread: the node's loop thread only.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tc_admin.h"
#include "tc_lockwait.h"
#include "tc_log.h"
#include "tc_ctx.h"
#include "tc_admin_exec.h"
#include "tc_phase2.h"
#include "tc_recovery.h"
#include "tc_server.h"
#include "tc_stats.h"
#include "tc_store_read.h"


#define READ_DEADLINE_MS 5000
#define DRIVE_LEASE_MS 15000
#define MAX_SHOWN_LOCKS 1000
#define MAX_SHOWN_WAITERS 1000

typedef struct exec {
  tc_adm_req_t *req;
  tc_ctx_t *ctx;
  char xid[TXP_MAX_XID_LEN + 1];
  tc_adm_plan_t plan;
  tc_op_t op; /* DECIDE */
} exec_t;

static void finish(exec_t *x, json_t *answer) {
  tc_adm_req_t *req = x->req;
  tc_op_clear(&x->op);
  free(x);
  tc__admin_finish(req, answer);
}

static void finish_error(exec_t *x, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void finish_error(exec_t *x, const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  finish(x, tc__admin_error(code, "%s", msg));
}

/* A read could not be sent ('rc' of a tc_read_*): answer the request. */
static void finish_unsent(exec_t *x, int rc) {
  if (rc == TC_READ_ENOMEM)
    finish_error(x, "internal", "out of memory");
  else
    finish_error(x, rc == TC_READ_ECLOSING ? "shutting_down" : "store",
                 rc == TC_READ_ECLOSING ? "coordinator shutting down" : "coordinator store queue full: retry later");
}

/* The answer to a failed read: 'what' says what could not be read. */
static void finish_store_error(exec_t *x, int status, const char *err, const char *what) {
  if (status == TC_READ_ESTMT)
    finish_error(x, "store", "could not %s: store error: %s", what, err);
  else if (status == TC_READ_ECLOSING)
    finish_error(x, "shutting_down", "could not %s: coordinator shutting down", what);
  else if (status == TC_READ_ENOMEM)
    finish_error(x, "internal", "could not %s: out of memory", what);
  else
    finish_error(x, "store", "could not %s: coordinator store unavailable (%s)", what,
                 status == TC_READ_EBROKEN ? "connection lost" : "no connection");
}

/* Whether a read failed ('status'); then the answer says so: 'what' could
 * not be read. */
static bool read_failed(exec_t *x, int status, const char *err, const char *what) {
  if (status == TC_READ_OK) return false;
  finish_store_error(x, status, err, what);
  return true;
}

/* After sending a read: unless it went ('rc' 0), the answer says why not. */
static void sent_or_finish(exec_t *x, int rc) {
  if (rc != 0) finish_unsent(x, rc);
}

/* ---------------------------------------------------------------- rows */

/* A column's text, or null for SQL NULL. */
static json_t *str_or_null(const char *s) { return s ? tc__admin_str(s) : json_null(); }

static json_t *ok_answer(void) { return json_pack("{s:b}", "ok", 1); }

/* One member of an answer's object. */
typedef struct json_member {
  const char *key;
  json_t *value; /* the object takes it */
} json_member_t;

static json_t *set_members(json_t *o, const json_member_t *m, size_t n) {
  for (size_t i = 0; i < n; i++) json_object_set_new(o, m[i].key, m[i].value);
  return o;
}

/* Set the members {"key", value} given on object 'o', in that order, and
 * return 'o': MEMBERS(o, {"xid", ...}, {"status", ...}). */
#define MEMBERS(o, ...)                                                                                    \
  set_members((o), (const json_member_t[]){__VA_ARGS__},                                                   \
              sizeof((const json_member_t[]){__VA_ARGS__}) / sizeof(json_member_t))

/* The answer of a list: 'list' (its first 'limit' of the 'n' rows read)
 * as 'key', how many it shows, and whether there were more. */
static json_t *list_answer(const char *key, json_t *list, int n, int limit) {
  return MEMBERS(ok_answer(), {key, list}, {"count", json_integer(n < limit ? n : limit)},
                 {"truncated", json_boolean(n > limit)});
}

/* What a live and a finished global transaction show first, alike. */
static json_t *global_head_json(json_t *xid, int64_t transaction_id, int status, const char *name,
                                const char *application_id) {
  return MEMBERS(json_object(), {"xid", xid}, {"transaction_id", json_integer(transaction_id)},
                 {"status", json_string(txp_global_status_name(status))}, {"status_code", json_integer(status)},
                 {"name", str_or_null(name)}, {"application_id", str_or_null(application_id)});
}

/* A finished one ('xid' and its history row), as far as both views of it
 * show it. */
static json_t *finished_json(json_t *xid, const tc_read_history_t *h) {
  json_t *o = global_head_json(xid, h->transaction_id, h->status, h->name, h->application_id);
  return MEMBERS(o, {"begin_time", str_or_null(h->begin_time)}, {"end_time", str_or_null(h->end_time)});
}

/* ------------------------------------------------------------- globals */

static json_t *global_json(const tc_read_global_t *r) {
  json_t *g = global_head_json(str_or_null(r->xid), r->transaction_id, r->status, r->name, r->application_id);
  return MEMBERS(g, {"node_id", json_integer(r->node_id)}, {"begin_time", str_or_null(r->begin_time)},
                 {"age_s", json_real(r->age_s)}, {"timeout_ms", json_integer(r->timeout_ms)},
                 {"deadline", str_or_null(r->deadline)}, {"timed_out", json_boolean(r->timed_out)},
                 {"retry_count", json_integer(r->retry_count)}, {"next_retry_at", str_or_null(r->next_retry_at)},
                 {"last_error", str_or_null(r->last_error)}, {"branches", json_integer(r->branches)},
                 {"locks", json_integer(r->locks)}, {"live", json_true()});
}

static void on_globals(int status, const char *err, const tc_read_global_t *rows, int n, void *arg) {
  exec_t *x = arg;
  if (read_failed(x, status, err, "list global transactions")) return;
  int limit = x->req->cmd.limit;
  json_t *list = json_array();
  for (int i = 0; i < n && i < limit; i++) json_array_append_new(list, global_json(&rows[i]));
  finish(x, list_answer("globals", list, n, limit));
}

/* What a "show globals" or "show history" command keeps. */
static tc_read_list_filter_t list_filter(const tc_adm_cmd_t *c) {
  return (tc_read_list_filter_t){
    .statuses = c->statuses,
    .nstatuses = c->nstatuses,
    .name = c->has_name ? c->name : NULL,
    .limit = c->limit + 1, /* one more: truncated? */
  };
}

static void exec_show_globals(exec_t *x) {
  const tc_adm_cmd_t *c = &x->req->cmd;
  tc_read_globals_filter_t f = {.list = list_filter(c), .has_min_age = c->has_min_age, .min_age_s = c->min_age_s};
  sent_or_finish(x, tc_read_globals(x->ctx->store, &f, READ_DEADLINE_MS, on_globals, x));
}

/* ------------------------------------------------------------- history */

static void on_history(int status, const char *err, const tc_read_finished_t *rows, int n, void *arg) {
  exec_t *x = arg;
  if (read_failed(x, status, err, "list finished global transactions")) return;
  int limit = x->req->cmd.limit;
  json_t *list = json_array();
  for (int i = 0; i < n && i < limit; i++) {
    const tc_read_finished_t *r = &rows[i];
    json_array_append_new(list, MEMBERS(finished_json(str_or_null(r->xid), &r->h),
                                        {"duration_s", json_real(r->duration_s)},
                                        {"branches", json_integer(r->branches)}, {"live", json_false()}));
  }
  finish(x, list_answer("history", list, n, limit));
}

static void exec_show_history(exec_t *x) {
  const tc_adm_cmd_t *c = &x->req->cmd;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
  tc_read_history_filter_t f = {
    .list = list_filter(c),
    .xid = c->has_xid ? c->xid : NULL,
    .has_since = c->since.set,
    .since_unix = tc_adm_time_unix(&c->since, now),
    .has_until = c->until.set,
    .until_unix = tc_adm_time_unix(&c->until, now),
  };
  sent_or_finish(x, tc_read_history(x->ctx->store, &f, READ_DEADLINE_MS, on_history, x));
}

/* -------------------------------------------------------- waiters (W) */

typedef struct {
  json_t *queue; /* W objects */
  uint64_t now;
  size_t shown;
} waiters_ctx_t;

static void add_waiter(const char *holder, const tc_waiter_t *w, void *arg) {
  waiters_ctx_t *wc = arg;
  (void)holder;
  if (wc->shown >= MAX_SHOWN_WAITERS) return;
  wc->shown++;
  json_t *o = json_object();
  json_object_set_new(o, "xid", w->xid ? tc__admin_str(w->xid) : json_null());
  json_object_set_new(o, "waiting_ms",
                      json_integer(w->first_queued_ns && wc->now > w->first_queued_ns
                                     ? (json_int_t)((wc->now - w->first_queued_ns) / 1000000u)
                                     : 0));
  json_object_set_new(o, "timeout_in_ms",
                      json_integer(w->deadline_ns > wc->now ? (json_int_t)((w->deadline_ns - wc->now) / 1000000u) : 0));
  json_array_append_new(wc->queue, o);
}

typedef struct {
  json_t *groups;  /* [{"holder":x,"queue":[W...]}] */
  json_t *current; /* the queue being filled */
  waiters_ctx_t wc;
} group_ctx_t;

static void group_waiter(const char *holder, const tc_waiter_t *w, void *arg) {
  group_ctx_t *gc = arg;
  size_t n = json_array_size(gc->groups);
  json_t *last = n ? json_array_get(gc->groups, n - 1) : NULL;
  const char *last_holder = last ? json_string_value(json_object_get(last, "holder")) : NULL;
  if (!last_holder || strcmp(last_holder, holder) != 0) {
    json_t *group = json_object();
    gc->current = json_array();
    if (!group || !gc->current) {
      json_decref(group);
      json_decref(gc->current);
      gc->current = NULL;
      return;
    }
    json_object_set_new(group, "holder", tc__admin_str(holder));
    json_object_set(group, "queue", gc->current);
    json_array_append_new(gc->groups, group);
    json_decref(gc->current); /* the group holds it; 'current' stays borrowed */
  }
  if (!gc->current) return;
  gc->wc.queue = gc->current;
  add_waiter(holder, w, &gc->wc);
}

/* The wait queue (this node's) of 'holder' as an array of W. */
static json_t *waiters_of(tc_ctx_t *ctx, const char *holder) {
  waiters_ctx_t wc = {json_array(), uv_hrtime(), 0};
  if (ctx->lockwait && !ctx->stopping) tc_lockwait_each(ctx->lockwait, holder, add_waiter, &wc);
  return wc.queue;
}

/* -------------------------------------------------------------- global */

static json_t *lock_json(const tc_read_lock_t *l, bool with_xid) {
  json_t *o = json_object();
  json_object_set_new(o, "row_key", str_or_null(l->row_key));
  if (with_xid) json_object_set_new(o, "xid", str_or_null(l->xid));
  json_object_set_new(o, "branch_id", json_integer(l->branch_id));
  json_object_set_new(o, "resource_id", str_or_null(l->resource_id));
  json_object_set_new(o, "table", str_or_null(l->table));
  json_object_set_new(o, "pk", str_or_null(l->pk));
  json_object_set_new(o, "status", json_string(l->status == 1 ? "rollbacking" : "locked"));
  json_object_set_new(o, "since", str_or_null(l->since));
  return o;
}

static json_t *branches_from_table(const tc_read_branch_t *rows, int n) {
  json_t *list = json_array();
  for (int i = 0; i < n; i++) {
    const tc_read_branch_t *r = &rows[i];
    json_array_append_new(
      list, MEMBERS(json_object(), {"branch_id", json_integer(r->branch_id)},
                    {"resource_id", str_or_null(r->resource_id)},
                    {"branch_type", json_string(txp_branch_type_name(r->branch_type))},
                    {"status", json_string(txp_branch_status_name(r->status))},
                    {"status_code", json_integer(r->status)},
                    {"client_id", str_or_null(r->client_id)}, {"retry_count", json_integer(r->retry_count)},
                    {"next_retry_at", str_or_null(r->next_retry_at)}, {"last_error", str_or_null(r->last_error)},
                    {"lock_keys", str_or_null(r->lock_keys)}, {"application_data", str_or_null(r->application_data)},
                    {"created", str_or_null(r->created)}, {"modified", str_or_null(r->modified)}));
  }
  return list;
}

/* history.branches as tc_history_branches() gives it (objects, whichever
 * form the row holds: sql/tc/015): rename its numeric codes to names, as
 * for live branches. */
static json_t *branches_from_history(const char *text) {
  json_t *in = json_loads(text, 0, NULL);
  json_t *out = json_array();
  size_t i;
  json_t *b;
  if (!json_is_array(in)) {
    json_decref(in);
    return out;
  }
  json_array_foreach(in, i, b) {
    int s = (int)json_integer_value(json_object_get(b, "status"));
    int t = (int)json_integer_value(json_object_get(b, "branch_type"));
    json_t *o = json_object();
    json_object_set(o, "branch_id", json_object_get(b, "branch_id"));
    json_object_set(o, "resource_id", json_object_get(b, "resource_id"));
    json_object_set_new(o, "branch_type", json_string(txp_branch_type_name(t)));
    json_object_set_new(o, "status", json_string(txp_branch_status_name(s)));
    json_object_set_new(o, "status_code", json_integer(s));
    json_array_append_new(out, o);
  }
  json_decref(in);
  return out;
}

static void on_global(int status, const char *err, const tc_read_global_view_t *v, void *arg) {
  exec_t *x = arg;
  if (read_failed(x, status, err, "read the global transaction")) return;
  json_t *a = ok_answer();
  json_t *branches = NULL;
  if (v->global) {
    json_object_set_new(a, "global", global_json(v->global));
  } else if (v->history) {
    const tc_read_history_t *h = v->history;
    json_object_set_new(a, "global", MEMBERS(finished_json(tc__admin_str(x->xid), h), {"live", json_false()}));
    branches = branches_from_history(h->branches_json ? h->branches_json : "");
    /* Branch rows still in branch_table belong to no live session. */
    json_object_set_new(a, "leftover_branches", json_integer(v->nbranches));
  } else if (v->nbranches == 0 && v->nlocks == 0) {
    json_decref(a);
    finish_error(x, "not_found", "global transaction \"%s\" not found (neither live nor in history)", x->xid);
    return;
  } else {
    json_object_set_new(a, "global", json_null());
    json_object_set_new(a, "orphan", json_true());
  }
  json_object_set_new(a, "branches", branches ? branches : branches_from_table(v->branches, v->nbranches));
  json_t *locks = json_array();
  for (int i = 0; i < v->nlocks && i < MAX_SHOWN_LOCKS; i++)
    json_array_append_new(locks, lock_json(&v->locks[i], false));
  json_object_set_new(a, "locks", locks);
  json_object_set_new(a, "locks_truncated", json_boolean(v->nlocks > MAX_SHOWN_LOCKS));
  json_object_set_new(a, "waiters", waiters_of(x->ctx, x->xid));
  finish(x, a);
}

static void exec_show_global(exec_t *x) {
  sent_or_finish(x, tc_read_global(x->ctx->store, x->xid, MAX_SHOWN_LOCKS + 1, READ_DEADLINE_MS, on_global, x));
}

/* --------------------------------------------------------------- locks */

static void on_locks(int status, const char *err, const tc_read_lock_t *rows, int n, void *arg) {
  exec_t *x = arg;
  if (read_failed(x, status, err, "list locks")) return;
  const tc_adm_cmd_t *c = &x->req->cmd;
  int limit = c->limit;
  json_t *locks = json_array();
  json_t *holders = json_object(); /* xid -> true, in order of first appearance */
  json_t *order = json_array();
  for (int i = 0; i < n && i < limit; i++) {
    const tc_read_lock_t *l = &rows[i];
    json_t *o = lock_json(l, true);
    json_object_set_new(o, "holder_status",
                        l->orphan ? json_null() : json_string(txp_global_status_name(l->holder_status)));
    json_object_set_new(o, "orphan", json_boolean(l->orphan));
    json_array_append_new(locks, o);
    const char *hx = l->xid ? l->xid : "";
    if (!json_object_get(holders, hx)) {
      json_object_set_new(holders, hx, json_true());
      json_array_append_new(order, tc__admin_str(hx));
    }
  }
  json_t *waiters = json_array();
  if (c->has_xid) {
    json_t *q = waiters_of(x->ctx, c->xid);
    if (json_array_size(q)) json_array_append_new(waiters, json_pack("{s:o, s:o}", "holder", tc__admin_str(c->xid), "queue", q));
    else json_decref(q);
  } else if (c->has_key || c->has_prefix) {
    size_t i;
    json_t *hx;
    json_array_foreach(order, i, hx) {
      json_t *q = waiters_of(x->ctx, json_string_value(hx));
      if (json_array_size(q)) json_array_append_new(waiters, json_pack("{s:O, s:o}", "holder", hx, "queue", q));
      else json_decref(q);
    }
  } else {
    /* Every queue on this node: the visit goes queue by queue. */
    group_ctx_t gc = {waiters, NULL, {NULL, uv_hrtime(), 0}};
    if (x->ctx->lockwait && !x->ctx->stopping) tc_lockwait_each(x->ctx->lockwait, NULL, group_waiter, &gc);
  }
  json_decref(holders);
  json_decref(order);
  json_t *a = list_answer("locks", locks, n, limit);
  json_object_set_new(a, "waiters", waiters);
  finish(x, a);
}

static void exec_show_locks(exec_t *x) {
  const tc_adm_cmd_t *c = &x->req->cmd;
  tc_read_locks_filter_t f = {
    .xid = c->has_xid ? c->xid : NULL,
    .key = c->has_key ? c->key : NULL,
    .prefix = c->has_prefix ? c->key : NULL,
    .limit = c->limit + 1, /* one more: truncated? */
  };
  sent_or_finish(x, tc_read_locks(x->ctx->store, &f, READ_DEADLINE_MS, on_locks, x));
}

/* --------------------------------------------------------------- nodes */

static void on_nodes(int status, const char *err, const tc_read_node_t *rows, int n, void *arg) {
  exec_t *x = arg;
  if (x->ctx->stopping) status = TC_READ_ECLOSING; /* the recovery may be gone */
  if (read_failed(x, status, err, "list the nodes")) return;
  tc_ctx_t *ctx = x->ctx;
  json_t *nodes = json_array();
  for (int i = 0; i < n; i++) {
    const tc_read_node_t *r = &rows[i];
    json_array_append_new(
      nodes, MEMBERS(json_object(), {"node_id", json_integer(r->node_id)}, {"state", str_or_null(r->state)},
                     {"address", str_or_null(r->address)}, {"admin_socket", str_or_null(r->admin_socket)},
                     {"started_at", str_or_null(r->started_at)}, {"heartbeat_at", str_or_null(r->heartbeat_at)},
                     {"heartbeat_age_s", json_real(r->heartbeat_age_s)}, {"is_leader", json_boolean(r->is_leader)},
                     {"pid", r->has_pid ? json_integer(r->pid) : json_null()}, {"version", str_or_null(r->version)},
                     {"self", json_boolean(r->node_id == ctx->cfg->node_id)}));
  }
  json_t *self = MEMBERS(json_object(), {"node_id", json_integer(ctx->cfg->node_id)},
                         {"address", tc__admin_str(ctx->advertise)},
                         {"leader", json_boolean(ctx->recovery && tc_recovery_is_leader(ctx->recovery))},
                         {"serving", json_boolean(ctx->serving && !ctx->stopping)},
                         {"admin_socket", tc__admin_str(ctx->cfg->admin_socket)}, {"pid", json_integer(getpid())},
                         {"version", json_string(TXC_VERSION)});
  json_t *a = ok_answer();
  json_object_set_new(a, "self", self);
  json_object_set_new(a, "nodes", nodes);
  finish(x, a);
}

static void exec_show_nodes(exec_t *x) {
  sent_or_finish(x, tc_read_nodes(x->ctx->store, x->ctx->cfg->cluster_leader_lease_ms, x->ctx->cfg->leader_lock_key,
                                  READ_DEADLINE_MS, on_nodes, x));
}

/* --------------------------------------------------------------- stats */

#define U(v) json_integer((json_int_t)(v))

static void on_stats(int status, const char *err, const tc_read_count_t *rows, int n, void *arg) {
  exec_t *x = arg;
  tc_ctx_t *ctx = x->ctx;
  if (ctx->stopping) {
    /* The server, recovery and lock waits may be released already. */
    finish_store_error(x, TC_READ_ECLOSING, err, "read the statistics");
    return;
  }
  tc_stats_t sn = {0};
  tc_stats_read(ctx, &sn);
  const tc_node_stats_t *ns = &sn.counters;
  json_t *a = ok_answer();

  json_object_set_new(a, "node",
                      json_pack("{s:i, s:o, s:b, s:b, s:i, s:s}", "node_id", sn.node_id, "address",
                                tc__admin_str(ctx->advertise), "leader", sn.leader, "serving",
                                sn.serving && !sn.stopping, "pid", (int)getpid(), "version", TXC_VERSION));
  json_object_set_new(a, "globals",
                      json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "begun", U(ns->begun), "committed", U(ns->committed),
                                "rolled_back", U(ns->rolled_back), "timed_out", U(ns->timed_out), "commit_failed",
                                U(ns->commit_failed), "rollback_failed", U(ns->rollback_failed)));
  json_object_set_new(a, "begins_held",
                      json_pack("{s:o, s:o, s:o, s:o, s:o}", "held", U(sn.hold.held), "parked", U(sn.hold.parked),
                                "retrying", U(sn.hold.retrying),
                                "stored_with_registration", U(sn.hold.folded), "stored_alone",
                                U(sn.hold.stored_alone)));
  json_object_set_new(a, "branches",
                      json_pack("{s:o, s:o}", "registered", U(ns->registered), "register_conflicts",
                                U(ns->register_conflicts)));
  json_object_set_new(a, "locks",
                      json_pack("{s:o, s:o, s:f, s:o}", "waits", U(ns->lock_waits), "wait_timeouts",
                                U(ns->lock_wait_timeouts), "wait_seconds", (double)ns->lock_wait_ms_total / 1000.0,
                                "waiting", U(sn.lock_waiters)));
  json_object_set_new(a, "phase2",
                      json_pack("{s:o, s:o, s:o, s:o, s:o, s:i, s:o, s:o}", "calls", U(ns->phase2_calls),
                                "retryable", U(ns->phase2_retryable), "unretryable", U(ns->phase2_unretryable),
                                "no_rm", U(ns->phase2_no_rm), "forwarded", U(ns->phase2_forwarded), "active",
                                ns->phase2_active, "commit_drives", U(ns->phase2_count[0]), "rollback_drives",
                                U(ns->phase2_count[1])));
  json_object_set_new(a, "requests", json_pack("{s:o, s:o, s:o}", "total", U(ns->requests), "bad", U(ns->bad_requests),
                                                   "not_owner", U(ns->not_owner)));
  if (sn.has_server) {
    const tc_server_stats_t *ss = &sn.server;
    json_object_set_new(
      a, "server",
      json_pack("{s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "connections", ss->connections,
                "rms",
                ss->rms, "tms", ss->tms, "accepted", U(ss->accepted), "refused", U(ss->refused), "closed",
                U(ss->closed), "frames_in", U(ss->frames_in), "frames_out", U(ss->frames_out), "bad_frames",
                U(ss->bad_frames), "busy_replies", U(ss->busy_replies), "auth_failures", U(ss->auth_failures),
                "version_mismatches", U(ss->version_mismatches), "unregistered_closed",
                U(ss->unregistered_closed), "refused_per_address", U(ss->refused_per_address)));
  }
  if (sn.has_bus) {
    const tc_bus_stats_t *bs = &sn.bus;
    json_t *rej = json_object();
    for (int i = 0; i < TC_BUS_REJECT_N; i++) json_object_set_new(rej, tc_bus_reject_name(i), U(bs->rejected[i]));
    json_object_set_new(a, "bus",
                        json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "peers_up", bs->peers_up, "sent",
                                  U(bs->sent), "received", U(bs->received), "send_dropped", U(bs->send_dropped),
                                  "rejected", rej, "forwards_sent", U(bs->forwards_sent), "forwards_answered",
                                  U(bs->forwards_answered), "forwards_served", U(bs->forwards_served)));
  }
  const tc_store_stats_t *st = &sn.store;
  json_object_set_new(
    a, "store",
    json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:f, s:f, s:i, s:{s:o, s:o, s:o, s:o}}", "batches", U(st->batches),
              "ops", U(st->ops), "batch_retries", U(st->batch_retries), "op_failures", U(st->op_failures), "deadlocks",
              U(st->deadlocks), "queue_len", U(st->queue_len), "queue_peak", U(st->queue_peak), "batch_ms_avg",
              st->batches ? st->batch_ms_total / (double)st->batches : 0.0, "ops_per_batch",
              st->batches ? (double)st->ops / (double)st->batches : 0.0, "ready_conns", sn.store_ready_conns,
              "ops_by_kind", "begin", U(st->ops_by_kind[TC_OP_BEGIN]), "register", U(st->ops_by_kind[TC_OP_REGISTER]),
              "decide", U(st->ops_by_kind[TC_OP_DECIDE]), "phase2", U(st->ops_by_kind[TC_OP_PHASE2])));
  if (sn.has_recovery) {
    const tc_recovery_stats_t *rs = &sn.rec;
    json_object_set_new(a, "recovery",
                        json_pack("{s:o, s:o, s:o, s:o}", "leader_terms", U(rs->leader_terms), "timed_out",
                                  U(rs->timed_out), "retried", U(rs->retried), "history_pruned", U(rs->history_pruned)));
  }
  const tc_admin_stats_t *as = &sn.admin;
  json_object_set_new(a, "admin",
                      json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "connections", as->connections, "accepted",
                                U(as->accepted), "denied", U(as->denied), "requests", U(as->requests), "bad_requests",
                                U(as->bad_requests), "repairs", U(as->repairs), "refused", U(as->refused)));
  if (status == TC_READ_OK) {
    json_t *sessions = json_object();
    for (int i = 0; i < n; i++)
      json_object_set_new(sessions, txp_global_status_name(rows[i].status), json_integer(rows[i].count));
    json_object_set_new(a, "sessions", sessions);
  } else {
    json_object_set_new(a, "sessions", json_null());
    json_object_set_new(a, "sessions_error", json_string("could not count sessions: store unavailable"));
  }
  finish(x, a);
}

static void exec_stats(exec_t *x) {
  sent_or_finish(x, tc_read_sessions(x->ctx->store, READ_DEADLINE_MS, on_stats, x));
}

/* ---------------------------------------------------------------- help */

static void exec_help(exec_t *x) {
  static const char *const lines[][2] = {
    {"show globals [status=S[,S...]] [min_age=SECONDS] [name=N] [limit=N]",
     "unfinished global transactions, oldest first"},
    {"show global XID", "one global transaction: branches, locks, this node's lock waiters"},
    {"show locks [xid=X] [key=K|prefix=P] [limit=N]", "global row locks and this node's wait queues"},
    {"show history [xid=X] [status=S[,S...]] [name=N] [since=T] [until=T] [limit=N]",
     "finished global transactions, the latest first (T: 15m, 2h, 7d ago or 2026-12-03T15:04:05Z)"},
    {"show nodes", "cluster members (node_table) and this node's leader flag"},
    {"stats", "this node's counters and the sessions by status"},
    {"rollback XID", "force rollback: from Begin, or re-drive a retrying/failed/stopped rollback"},
    {"commit XID", "force commit: from Begin, or re-drive a retrying/failed/stopped commit"},
    {"stop-retry XID", "stop phase-two retries (StopCommitRetry / StopRollbackRetry)"},
    {"resume-retry XID", "resume stopped retries (the leader retries at once)"},
    {"redrive XID", "re-send phase two now, following the recorded decision"},
    {"delete XID", "delete lock and branch rows left by a finished or unknown transaction"},
    {"failpoint list", "fault-injection points and how they are armed (test builds only)"},
    {"failpoint arm NAME=ACTION[@N][,...]", "arm points: abort, stop, trace, fail or off, on the Nth hit"},
  };
  json_t *list = json_array();
  for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
    json_array_append_new(list, json_pack("{s:s, s:s}", "usage", lines[i][0], "help", lines[i][1]));
  json_t *a = ok_answer();
  json_object_set_new(a, "commands", list);
  finish(x, a);
}

/* ----------------------------------------------------------- failpoints */

/* failpoint list | failpoint arm SPEC: only builds with TX_FAILPOINTS
 * have the points; elsewhere both are refused, so a fault script cannot
 * believe it armed a point that does not exist. */
static void exec_failpoint(exec_t *x) {
  if (!txc_failpoint_compiled()) {
    finish_error(x, "unsupported", "this tcd has no failpoints: build it with -DTX_FAILPOINTS=ON (test builds)");
    return;
  }
  if (x->req->cmd.kind == TC_ADM_FAILPOINT_ARM) {
    char err[256];
    if (txc_failpoint_arm(x->req->cmd.spec, err, sizeof(err)) != 0) {
      finish_error(x, "bad_request", "%s", err);
      return;
    }
    TC_LOG(TC_LOG_WARN, NULL, "operator uid %u (pid %d) armed failpoint(s) %s", x->req->uid, x->req->pid,
           x->req->cmd.spec);
  }
  char buf[2048];
  txc_failpoint_list(buf, sizeof(buf));
  json_t *list = json_array();
  for (char *line = buf, *nl; *line && (nl = strchr(line, '\n')); line = nl + 1) {
    *nl = '\0';
    char name[64], action[16];
    unsigned long hits = 0;
    if (sscanf(line, "%63s %15s %lu", name, action, &hits) == 3)
      json_array_append_new(list, json_pack("{s:s, s:s, s:I}", "name", name, "action", action,
                                            "fires_at_hit", (json_int_t)hits));
  }
  json_t *a = ok_answer();
  json_object_set_new(a, "failpoints", list);
  finish(x, a);
}

/* ------------------------------------------------------------- repairs */

static const char *verb(tc_adm_kind_t k) {
  switch (k) {
  case TC_ADM_ROLLBACK: return "force a rollback of";
  case TC_ADM_COMMIT: return "force a commit of";
  case TC_ADM_STOP_RETRY: return "stop the retries of";
  case TC_ADM_RESUME_RETRY: return "resume the retries of";
  case TC_ADM_REDRIVE: return "re-drive";
  case TC_ADM_DELETE: return "delete the leftovers of";
  default: return "repair";
  }
}

/* Log and count a refused repair, then answer it. */
static void refuse(exec_t *x, const char *code, const char *msg) {
  tc_log_ctx_t lc = {x->xid, 0, NULL};
  TC_LOG(TC_LOG_INFO, &lc, "operator uid %u (pid %d): %s refused: %s", x->req->uid, x->req->pid,
         tc_adm_kind_name(x->req->cmd.kind), msg);
  tc__admin_count_repair(x->req->adm, true);
  finish(x, tc__admin_error(code, "%s", msg));
}

static void log_repair(exec_t *x, const char *what) {
  tc_log_ctx_t lc = {x->xid, 0, NULL};
  TC_LOG(TC_LOG_WARN, &lc, "operator uid %u (pid %d): %s: %s", x->req->uid, x->req->pid,
         tc_adm_kind_name(x->req->cmd.kind), what);
  tc__admin_count_repair(x->req->adm, false);
}

static json_t *repair_answer(exec_t *x) {
  json_t *a = ok_answer();
  json_object_set_new(a, "xid", tc__admin_str(x->xid));
  json_object_set_new(a, "action", json_string(tc_adm_kind_name(x->req->cmd.kind)));
  json_object_set_new(a, "from", json_string(txp_global_status_name(x->plan.from)));
  json_object_set_new(a, "to", json_string(txp_global_status_name(x->plan.to)));
  return a;
}

static void on_drive_done(int global_status, void *arg) {
  exec_t *x = arg;
  json_t *a = repair_answer(x);
  json_object_set_new(a, "status", json_string(txp_global_status_name(global_status)));
  json_object_set_new(a, "finished", json_boolean(txp_global_status_final(global_status) &&
                                                  !txp_global_status_needs_operator(global_status)));
  finish(x, a);
}

static void on_cas(int status, const char *err, const tc_read_cas_result_t *r, void *arg) {
  exec_t *x = arg;
  char msg[768];
  if (status == TC_READ_EBROKEN || status == TC_READ_ENOMEM) {
    /* The repair may have been applied: say so, and where to look. */
    bool lost = status == TC_READ_EBROKEN;
    finish_error(x, lost ? "store" : "internal",
                 "could not %s global transaction \"%s\": %s, outcome unknown; check with \"show global\"",
                 verb(x->req->cmd.kind), x->xid,
                 lost ? "store connection lost in flight" : "out of memory reading the store's answer");
    return;
  }
  if (read_failed(x, status, err, "apply the repair")) return;
  const char *res = r->result;
  int now = r->global_status;
  if (strcmp(res, "not_found") == 0) {
    snprintf(msg, sizeof(msg), "global transaction \"%s\" finished meanwhile (%s): nothing changed", x->xid,
             txp_global_status_name(now));
    refuse(x, "refused", msg);
    return;
  }
  if (strcmp(res, "changed") == 0) {
    snprintf(msg, sizeof(msg),
             "global transaction \"%s\" changed meanwhile (%s, expected %s): nothing changed; look again and retry",
             x->xid, txp_global_status_name(now), txp_global_status_name(x->plan.from));
    refuse(x, "refused", msg);
    return;
  }
  if (strcmp(res, "branch") == 0) {
    snprintf(msg, sizeof(msg),
             "could not %s global transaction \"%s\": branch %" PRId64
             " is %s, so this would break atomicity; nothing changed",
             verb(x->req->cmd.kind), x->xid, r->branch_id, txp_branch_status_name(r->branch_status));
    refuse(x, "refused", msg);
    return;
  }
  if (strcmp(res, "ok") != 0) {
    finish_error(x, "internal", "unexpected store result \"%s\"", res);
    return;
  }
  snprintf(msg, sizeof(msg), "%s -> %s%s", txp_global_status_name(x->plan.from), txp_global_status_name(x->plan.to),
           x->plan.action == TC_ADM_ACT_CAS_DRIVE ? ", driving phase two now" : "");
  log_repair(x, msg);
  if (x->plan.action != TC_ADM_ACT_CAS_DRIVE) {
    finish(x, repair_answer(x));
    return;
  }
  tc__phase2_drive(x->ctx, x->xid, x->plan.to, r->rows, r->nrows, on_drive_done, x);
}

static void apply_cas(exec_t *x) {
  tc_read_retry_t retry = x->plan.retry == TC_ADM_RETRY_NOW     ? TC_READ_RETRY_NOW
                          : x->plan.retry == TC_ADM_RETRY_CLEAR ? TC_READ_RETRY_CLEAR
                                                                : TC_READ_RETRY_LEASE;
  tc_read_cas_t in = {
    .xid = x->xid,
    .from = x->plan.from,
    .to = x->plan.to,
    .retry = retry,
    .lease_ms = DRIVE_LEASE_MS,
    .forbid = x->plan.forbid,
    .nforbid = x->plan.nforbid,
  };
  sent_or_finish(x, tc_read_admin_cas(x->ctx->store, &in, READ_DEADLINE_MS, on_cas, x));
}

static void on_decided(tc_op_t *op, void *arg) {
  exec_t *x = arg;
  tc_ctx_t *ctx = x->ctx;
  char msg[768];
  if (op->status != 0) {
    finish_error(x, "store", "could not %s global transaction \"%s\": %s", verb(x->req->cmd.kind), x->xid,
                 op->errmsg);
    return;
  }
  switch (op->res) {
  case TC_RES_OK:
  case TC_RES_TIMED_OUT: {
    if (!ctx->stopping) tc_ctx_release_locks(ctx, x->xid);
    bool commit = txp_global_status_is_commit(op->global_status);
    if (op->res == TC_RES_TIMED_OUT) ctx->stats.timed_out++;
    else if (commit) ctx->stats.committed++;
    else ctx->stats.rolled_back++;
    x->plan.to = op->global_status;
    snprintf(msg, sizeof(msg), "%s -> %s (forced decision)", txp_global_status_name(x->plan.from),
             txp_global_status_name(op->global_status));
    log_repair(x, msg);
    if (op->res == TC_RES_TIMED_OUT) {
      /* Not what was asked: the deadline passed between the check and the
       * decision, and the store turned the commit into a timeout. */
      if (!txp_global_status_final(op->global_status))
        tc__phase2_drive(ctx, x->xid, op->global_status, op->branches, op->nbranches, NULL, NULL);
      finish_error(x, "refused",
                   "could not commit global transaction \"%s\": its deadline passed meanwhile and the coordinator "
                   "rolled it back (%s)",
                   x->xid, txp_global_status_name(op->global_status));
      return;
    }
    if (txp_global_status_final(op->global_status)) {
      /* Finished already: no branches, or an AT commit without commit work
       * (sql/tc/010), whose branches are only told. */
      if (commit && op->nbranches > 0) tc__phase2_notify(ctx, x->xid, op->branches, op->nbranches);
      on_drive_done(op->global_status, x);
      return;
    }
    tc__phase2_drive(ctx, x->xid, op->global_status, op->branches, op->nbranches, on_drive_done, x);
    return;
  }
  case TC_RES_NOT_FOUND:
    finish_error(x, "not_found", "global transaction \"%s\" not found", x->xid);
    return;
  case TC_RES_DECIDED:
  case TC_RES_FINISHED:
    snprintf(msg, sizeof(msg), "global transaction \"%s\" was decided meanwhile (%s): nothing changed", x->xid,
             txp_global_status_name(op->global_status));
    refuse(x, "refused", msg);
    return;
  default:
    finish_error(x, "internal", "unexpected store result");
    return;
  }
}

static void apply_decide(exec_t *x) {
  x->op.kind = TC_OP_DECIDE;
  x->op.cb = on_decided;
  x->op.arg = x;
  x->op.xid = x->xid;
  x->op.action = x->plan.commit ? TC_DECIDE_COMMIT : TC_DECIDE_ROLLBACK;
  int rc = tc_store_submit(x->ctx->store, &x->op);
  if (rc != 0)
    finish_error(x, rc == TXP_EBUSY ? "store" : "shutting_down", "%s",
                 rc == TXP_EBUSY ? "coordinator store queue full: retry later" : "coordinator shutting down");
}

/* The stored state is in: plan, then apply. */
static void on_repair_state(int status, const char *err, const tc_read_repair_state_t *st, void *arg) {
  exec_t *x = arg;
  if (read_failed(x, status, err, "read the global transaction")) return;
  char msg[768];
  tc_adm_kind_t kind = x->req->cmd.kind;
  if (!st->live) {
    if (st->in_history) {
      snprintf(msg, sizeof(msg), "global transaction \"%s\" already finished (%s): nothing to %s", x->xid,
               txp_global_status_name(st->history_status), tc_adm_kind_name(kind));
      refuse(x, "refused", msg);
    } else {
      finish_error(x, "not_found", "global transaction \"%s\" not found", x->xid);
    }
    return;
  }
  int rc = tc_adm_plan_repair(kind, x->xid, st->global_status, st->branch_status, st->nbranches, &x->plan, msg,
                              sizeof(msg));
  if (rc != 0) {
    refuse(x, "refused", msg);
    return;
  }
  if (x->plan.action == TC_ADM_ACT_DECIDE) {
    if (x->plan.commit && st->past_deadline) {
      snprintf(msg, sizeof(msg),
               "could not commit global transaction \"%s\": it passed its deadline, so the coordinator rolls it "
               "back; use \"rollback\"",
               x->xid);
      refuse(x, "refused", msg);
      return;
    }
    apply_decide(x);
  } else {
    apply_cas(x);
  }
}

static void on_deleted(int status, const char *err, const tc_read_delete_result_t *r, void *arg) {
  exec_t *x = arg;
  char msg[768];
  if (read_failed(x, status, err, "delete the leftovers")) return;
  const char *res = r->result;
  int s = r->history_status;
  if (strcmp(res, "live") == 0) {
    snprintf(msg, sizeof(msg),
             "global transaction \"%s\" is live (%s): delete only removes what finished transactions left behind; "
             "use rollback, commit or redrive",
             x->xid, txp_global_status_name(s));
    refuse(x, "refused", msg);
    return;
  }
  if (strcmp(res, "not_found") == 0) {
    finish_error(x, "not_found", "global transaction \"%s\" not found: no history, no lock or branch rows", x->xid);
    return;
  }
  if (strcmp(res, "ok") != 0) {
    finish_error(x, "internal", "unexpected store result \"%s\"", res);
    return;
  }
  long long locks = (long long)r->locks, branches = (long long)r->branches;
  if (locks && !x->ctx->stopping) tc_ctx_release_locks(x->ctx, x->xid);
  json_t *a = ok_answer();
  json_object_set_new(a, "xid", tc__admin_str(x->xid));
  json_object_set_new(a, "action", json_string("delete"));
  json_object_set_new(a, "deleted", json_pack("{s:I, s:I}", "locks", (json_int_t)locks, "branches", (json_int_t)branches));
  json_object_set_new(a, "history_status", s ? json_string(txp_global_status_name(s)) : json_null());
  if (locks || branches) {
    snprintf(msg, sizeof(msg), "deleted %lld lock rows and %lld branch rows", locks, branches);
    log_repair(x, msg);
  }
  finish(x, a);
}

static void exec_repair(exec_t *x) {
  int rc = x->req->cmd.kind == TC_ADM_DELETE
             ? tc_read_admin_delete(x->ctx->store, x->xid, READ_DEADLINE_MS, on_deleted, x)
             : tc_read_repair_state(x->ctx->store, x->xid, READ_DEADLINE_MS, on_repair_state, x);
  if (rc != 0) finish_unsent(x, rc);
}

/* ------------------------------------------------------------ dispatch */

void tc__admin_execute(tc_adm_req_t *req) {
  exec_t *x = calloc(1, sizeof(*x));
  if (!x) {
    tc__admin_finish(req, NULL);
    return;
  }
  x->req = req;
  x->ctx = req->ctx;
  snprintf(x->xid, sizeof(x->xid), "%s", req->cmd.xid);
  if (!x->ctx->store || !x->ctx->serving) {
    finish_error(x, "shutting_down", "coordinator not serving yet");
    return;
  }
  switch (req->cmd.kind) {
  case TC_ADM_SHOW_GLOBALS: exec_show_globals(x); break;
  case TC_ADM_SHOW_GLOBAL: exec_show_global(x); break;
  case TC_ADM_SHOW_LOCKS: exec_show_locks(x); break;
  case TC_ADM_SHOW_HISTORY: exec_show_history(x); break;
  case TC_ADM_SHOW_NODES: exec_show_nodes(x); break;
  case TC_ADM_STATS: exec_stats(x); break;
  case TC_ADM_HELP: exec_help(x); break;
  case TC_ADM_FAILPOINT_LIST:
  case TC_ADM_FAILPOINT_ARM: exec_failpoint(x); break;
  case TC_ADM_ROLLBACK:
  case TC_ADM_COMMIT:
  case TC_ADM_STOP_RETRY:
  case TC_ADM_RESUME_RETRY:
  case TC_ADM_REDRIVE:
  case TC_ADM_DELETE: exec_repair(x); break;
  default: finish_error(x, "bad_request", "unknown command"); break;
  }
}
