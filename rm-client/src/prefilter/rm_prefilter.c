/*
 * rm_prefilter.c - the Redis prefilter's public calls: create/free, freeze,
 * confirm, release, waitlist, counters, error strings.
 *
 * NOTES
 *   Each call checks its arguments first (a bad one costs no round trip
 *   and is RM_PF_BAD_ARGS, as the scripts would answer), builds the keys of
 *   the activity (rm_prefilter_keys.c), runs its script through the pool
 *   (rm_prefilter_conn.c) on the calling thread, maps the reply to a code
 *   and counts it.  There is no state besides the pool and the counters, so
 *   the calls are safe from any number of threads.
 *
 *   What the codes mean for the caller, in the failure windows:
 *     - RM_E_CONN_LOST / RM_E_DEADLINE: the script did not run.
 *     - RM_E_UNKNOWN_OUTCOME: it may have run.  Every script is safe to run
 *       again with the same arguments (a freeze of the same order answers
 *       its first bucket; confirm/release answer "already"), so the caller
 *       resolves it by retrying the same call.
 *     - RM_PF_E_REDIS: Redis refused (OOM, BUSY, a script error); the
 *       scripts write only after every check has passed, so a refusal
 *       before the first write changed nothing.
 *   PostgreSQL remains the truth for what Redis holds: see
 *   rm_prefilter_pg.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rm_prefilter_int.h"

#define DEFAULT_COMMAND_TIMEOUT_MS 200u
#define DEFAULT_CONNECT_TIMEOUT_MS 500u
#define DEFAULT_MAX_CONNECTIONS 64u
#define DEFAULT_RECONNECT_MAX_MS 2000u
#define DEFAULT_FREEZE_TTL_MS 900000u
#define MAX_CONNECTIONS 4096u

/* ------------------------------------------------------------ helpers --- */

int64_t rm__pf_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

rm_pf_count_t rm__pf_count_index(int rc) {
  switch (rc) {
  case 0: return RM_PF_C_OK;
  case RM_PF_NOT_ON_SALE: return RM_PF_C_NOT_ON_SALE;
  case RM_PF_OVER_LIMIT: return RM_PF_C_OVER_LIMIT;
  case RM_PF_SOLD_OUT: return RM_PF_C_SOLD_OUT;
  case RM_PF_BAD_ARGS: return RM_PF_C_BAD_ARGS;
  case RM_PF_NOT_LOADED: return RM_PF_C_NOT_LOADED;
  case RM_PF_ALREADY_CONFIRMED: return RM_PF_C_ALREADY_CONFIRMED;
  case RM_PF_ALREADY_RELEASED: return RM_PF_C_ALREADY_RELEASED;
  case RM_PF_UNKNOWN_ORDER: return RM_PF_C_UNKNOWN_ORDER;
  case RM_PF_ALREADY_WAITING: return RM_PF_C_ALREADY_WAITING;
  case RM_E_UNKNOWN_OUTCOME: return RM_PF_C_UNKNOWN_OUTCOME;
  case RM_E_CONN_LOST:
  case RM_E_REDIS_NO_MASTER:
  case RM_E_DEADLINE: return RM_PF_C_NOT_SENT;
  default: return rc > 0 ? RM_PF_C_OK : RM_PF_C_ERROR;
  }
}

int rm__pf_count(rm_prefilter_t *pf, rm_pf_op_t op, int rc) {
  atomic_fetch_add_explicit(&pf->counts[op][rm__pf_count_index(rc)], 1, memory_order_relaxed);
  return rc;
}

int rm__pf_eval_code(rm_prefilter_t *pf, int script, int nkeys, const char *const *keys, int nargs,
                     const char *const *args) {
  redisReply *r = NULL;
  char err[200];
  long long v = 0;
  int rc = rm__pf_eval(&pf->pool, script, nkeys, keys, nargs, args, &r);
  if (rc != 0) return rc;
  rc = rm__pf_reply_int(r, &v, err, sizeof(err));
  freeReplyObject(r);
  if (rc == RM_PF_E_REDIS) {
    rm__errmsg_set("Redis refused script \"%s\": %s", rm__pf_script_name(script), err);
    return rc;
  }
  if (rc != 0) {
    rm__errmsg_set("unexpected reply to script \"%s\"", rm__pf_script_name(script));
    return rc;
  }
  rc = rm__pf_code_from_lua(v);
  if (rc == RM_PF_E_REPLY) rm__errmsg_set("unexpected result %lld of script \"%s\"", v, rm__pf_script_name(script));
  return rc;
}

static int bad_args(rm_prefilter_t *pf, rm_pf_op_t op, const char *what) {
  rm__errmsg_set("invalid argument: %s", what);
  return rm__pf_count(pf, op, RM_PF_BAD_ARGS);
}

/* ------------------------------------------------------ create, free --- */

int rm_prefilter_new(const char *redis_url, const rm_pf_options_t *opts, rm_prefilter_t **out) {
  rm_pf_url_t url;
  rm_prefilter_t *pf;
  int rc;
  if (out) *out = NULL;
  if (!out || rm__pf_url_parse(redis_url, &url) != 0) {
    rm__errmsg_set("invalid Redis URL \"%s\": expected redis://[:password@]host[:port][/db] or "
                   "redis+sentinel://[:password@]host[:port],.../master-name[/db]",
                   redis_url ? redis_url : "(null)");
    return RM_E_INVALID;
  }
  if (opts && (opts->log_level < 0 || opts->log_level > RM_LOG_DEBUG ||
               opts->max_connections > MAX_CONNECTIONS || opts->command_timeout_ms > 3600000u ||
               opts->connect_timeout_ms > 3600000u)) {
    rm__errmsg_set("invalid prefilter option");
    return RM_E_INVALID;
  }
  pf = calloc(1, sizeof(*pf));
  if (!pf) return RM_E_NOMEM;
  if (opts) pf->opts = *opts;
  if (!pf->opts.command_timeout_ms) pf->opts.command_timeout_ms = DEFAULT_COMMAND_TIMEOUT_MS;
  if (!pf->opts.connect_timeout_ms) pf->opts.connect_timeout_ms = DEFAULT_CONNECT_TIMEOUT_MS;
  if (!pf->opts.max_connections) pf->opts.max_connections = DEFAULT_MAX_CONNECTIONS;
  if (!pf->opts.reconnect_max_ms) pf->opts.reconnect_max_ms = DEFAULT_RECONNECT_MAX_MS;
  if (!pf->opts.freeze_ttl_ms) pf->opts.freeze_ttl_ms = DEFAULT_FREEZE_TTL_MS;
  if (!pf->opts.log_level) pf->opts.log_level = RM_LOG_WARN;
  if (rm__logger_init(&pf->log, pf->opts.log_cb, pf->opts.log_arg, pf->opts.log_level) != 0) {
    free(pf);
    return RM_E_NOMEM;
  }
  for (int i = 0; i < RM_PF_OP__COUNT; i++)
    for (int j = 0; j < RM_PF_C__COUNT; j++) atomic_init(&pf->counts[i][j], 0);
  rc = rm__pf_pool_init(&pf->pool, &url, pf->opts.command_timeout_ms, pf->opts.connect_timeout_ms,
                        pf->opts.max_connections, pf->opts.reconnect_max_ms, &pf->log);
  if (rc != 0) {
    rm__logger_destroy(&pf->log);
    free(pf);
    return rc;
  }
  *out = pf;
  return 0;
}

void rm_prefilter_free(rm_prefilter_t *pf) {
  if (!pf) return;
  rm__pf_pool_destroy(&pf->pool);
  rm__logger_destroy(&pf->log);
  free(pf);
}

int rm_prefilter_prewarm(rm_prefilter_t *pf, unsigned n, unsigned *opened) {
  if (opened) *opened = 0;
  if (!pf) return RM_E_INVALID;
  if (n > pf->pool.max_conns) n = pf->pool.max_conns;
  if (n == 0) return 0;
  rm_pf_conn_t **held = calloc(n, sizeof(*held));
  if (!held) return RM_E_NOMEM;
  uint64_t before = atomic_load(&pf->pool.connects);
  /* Hold each one until all are open: a connection given back at once
   * would be the next one taken, and only one would be opened. */
  int rc = 0;
  unsigned k = 0;
  while (k < n && (rc = rm__pf_conn_get(&pf->pool, &held[k])) == 0) k++;
  for (unsigned i = 0; i < k; i++) rm__pf_conn_put(&pf->pool, held[i], false);
  free(held);
  if (opened) *opened = (unsigned)(atomic_load(&pf->pool.connects) - before);
  return rc;
}

const char *rm_prefilter_strerror(int code) {
  switch (code) {
  case RM_PF_NOT_ON_SALE: return "activity not on sale";
  case RM_PF_OVER_LIMIT: return "over the per-user purchase limit";
  case RM_PF_SOLD_OUT: return "sold out";
  case RM_PF_BAD_ARGS: return "invalid prefilter argument";
  case RM_PF_NOT_LOADED: return "activity not loaded into Redis";
  case RM_PF_ALREADY_CONFIRMED: return "order already confirmed";
  case RM_PF_ALREADY_RELEASED: return "order already released";
  case RM_PF_UNKNOWN_ORDER: return "no freeze for this order";
  case RM_PF_ALREADY_WAITING: return "user already on the waitlist";
  case RM_PF_E_REDIS: return "Redis returned an error";
  case RM_PF_E_REPLY: return "unexpected reply from Redis";
  case RM_PF_E_CONFLICT: return "Redis kept changing during reconciliation";
  case RM_PF_NO_ACTIVITY: return "activity not found in the database";
  case RM_PF_E_HELD: return "a reconciliation held the activity in Redis too long: retry";
  case RM_E_REDIS_NO_MASTER: return "no Redis master reachable";
  default: return rm_strerror(code);
  }
}

const char *rm_prefilter_errmsg(void) { return rm_errmsg(); }

uint64_t rm_prefilter_master_changes(rm_prefilter_t *pf) {
  return pf ? (uint64_t)atomic_load_explicit(&pf->pool.master_changes, memory_order_relaxed) : 0;
}

/* ------------------------------------------------------------ freeze --- */

/* freeze.lua, with the queue stream as its sixth key when 'queued'. */
static int freeze_eval(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type, int64_t user_id,
                       int64_t order_id, int32_t qty, int64_t deadline_ms, bool queued, const char *idem_key,
                       int *bucket) {
  rm_pf_keys_t ks;
  char a_tt[16], a_user[24], a_order[24], a_qty[16], a_dl[24];
  int rc;
  if (!pf) return RM_E_INVALID;
  if (rm__pf_keys_build(&ks, activity_id, ticket_type) != 0 || !rm__pf_id_ok(user_id) ||
      !rm__pf_id_ok(order_id) || !rm__pf_qty_ok(qty) || !rm__pf_ms_ok(deadline_ms))
    return bad_args(pf, RM_PF_OP_FREEZE, "freeze needs activity, user and order ids >= 1, a ticket type >= 0, "
                                         "a quantity of 1 to 10000 and a deadline");
  rm__pf_i64_str(a_tt, ticket_type);
  rm__pf_i64_str(a_user, user_id);
  rm__pf_i64_str(a_order, order_id);
  rm__pf_i64_str(a_qty, qty);
  rm__pf_i64_str(a_dl, deadline_ms);
  const char *keys[] = {ks.k[RM_PF_K_META],   ks.k[RM_PF_K_STOCK], ks.k[RM_PF_K_BOUGHT],
                        ks.k[RM_PF_K_ORDERS], ks.k[RM_PF_K_EXPIRY], ks.k[RM_PF_K_QUEUE]};
  const char *args[] = {a_tt, a_user, a_order, a_qty, a_dl, idem_key};
  rc = rm__pf_eval_code(pf, RM_PF_S_FREEZE, queued ? 6 : 5, keys, queued && idem_key ? 6 : 5, args);
  if (rc >= 0) {
    if (bucket) *bucket = rc;
    rc = 0;
  }
  return rm__pf_count(pf, RM_PF_OP_FREEZE, rc);
}

int rm_prefilter_freeze_until(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                              int64_t user_id, int64_t order_id, int32_t qty, int64_t deadline_ms,
                              int *bucket) {
  return freeze_eval(pf, activity_id, ticket_type, user_id, order_id, qty, deadline_ms, false, NULL, bucket);
}

int rm_prefilter_freeze_queued(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type, int64_t user_id,
                               int64_t order_id, int32_t qty, int64_t deadline_ms, const char *idem_key,
                               int *bucket) {
  if (idem_key) {
    size_t n = strlen(idem_key);
    bool ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++)
      ok = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-", idem_key[i]) != NULL;
    if (!ok) return bad_args(pf, RM_PF_OP_FREEZE, "an idempotency key is 1 to 64 of A-Za-z0-9._:-");
  }
  return freeze_eval(pf, activity_id, ticket_type, user_id, order_id, qty, deadline_ms, true, idem_key, bucket);
}

int rm_prefilter_queue_key(int64_t activity_id, char *out, size_t outlen) {
  rm_pf_keys_t ks;
  if (!out || rm__pf_keys_build(&ks, activity_id, 0) != 0) return RM_E_INVALID;
  if ((size_t)snprintf(out, outlen, "%s", ks.k[RM_PF_K_QUEUE]) >= outlen) return RM_E_INVALID;
  return 0;
}

int rm_prefilter_freeze(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                        int64_t user_id, int64_t order_id, int32_t qty, int *bucket) {
  if (!pf) return RM_E_INVALID;
  return rm_prefilter_freeze_until(pf, activity_id, ticket_type, user_id, order_id, qty,
                                   rm__pf_unix_ms() + (int64_t)pf->opts.freeze_ttl_ms, bucket);
}

/* ---------------------------------------------------- confirm, release --- */

static int finish(rm_prefilter_t *pf, rm_pf_op_t op, int64_t activity_id, int32_t ticket_type,
                  int64_t order_id) {
  rm_pf_keys_t ks;
  char a_tt[16], a_order[24];
  int rc;
  if (!pf) return RM_E_INVALID;
  if (rm__pf_keys_build(&ks, activity_id, ticket_type) != 0 || !rm__pf_id_ok(order_id))
    return bad_args(pf, op, "needs activity and order ids >= 1 and a ticket type >= 0");
  rm__pf_i64_str(a_tt, ticket_type);
  rm__pf_i64_str(a_order, order_id);
  const char *args[] = {a_tt, a_order};
  if (op == RM_PF_OP_CONFIRM) {
    const char *keys[] = {ks.k[RM_PF_K_STOCK], ks.k[RM_PF_K_ORDERS], ks.k[RM_PF_K_EXPIRY], ks.k[RM_PF_K_META]};
    rc = rm__pf_eval_code(pf, RM_PF_S_CONFIRM, 4, keys, 2, args);
  } else {
    const char *keys[] = {ks.k[RM_PF_K_STOCK], ks.k[RM_PF_K_BOUGHT], ks.k[RM_PF_K_ORDERS],
                          ks.k[RM_PF_K_EXPIRY], ks.k[RM_PF_K_META]};
    rc = rm__pf_eval_code(pf, RM_PF_S_RELEASE, 5, keys, 2, args);
  }
  if (rc > 0) {
    rm__errmsg_set("unexpected result %d", rc);
    rc = RM_PF_E_REPLY;
  }
  return rm__pf_count(pf, op, rc);
}

int rm_prefilter_confirm(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                         int64_t order_id) {
  return finish(pf, RM_PF_OP_CONFIRM, activity_id, ticket_type, order_id);
}

int rm_prefilter_release(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                         int64_t order_id) {
  return finish(pf, RM_PF_OP_RELEASE, activity_id, ticket_type, order_id);
}

/* ----------------------------------------------------------- waitlist --- */

int rm_prefilter_waitlist_join(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                               int64_t user_id, int32_t qty, long *position) {
  rm_pf_keys_t ks;
  char a_user[24], a_qty[16], err[200];
  redisReply *r = NULL;
  int rc;
  if (!pf) return RM_E_INVALID;
  if (rm__pf_keys_build(&ks, activity_id, ticket_type) != 0 || !rm__pf_id_ok(user_id) ||
      !rm__pf_qty_ok(qty))
    return bad_args(pf, RM_PF_OP_JOIN, "waitlist join needs activity and user ids >= 1, a ticket "
                                       "type >= 0 and a quantity of 1 to 10000");
  rm__pf_i64_str(a_user, user_id);
  rm__pf_i64_str(a_qty, qty);
  const char *keys[] = {ks.k[RM_PF_K_META], ks.k[RM_PF_K_BOUGHT], ks.k[RM_PF_K_WL],
                        ks.k[RM_PF_K_WLQ], ks.k[RM_PF_K_WLSEQ]};
  const char *args[] = {a_user, a_qty};
  rc = rm__pf_eval(&pf->pool, RM_PF_S_WAITLIST_JOIN, 5, keys, 2, args, &r);
  if (rc == 0) {
    rc = rm__pf_parse_join(r, position, err, sizeof(err));
    freeReplyObject(r);
    if (rc == RM_PF_E_REDIS) rm__errmsg_set("Redis refused script \"waitlist_join\": %s", err);
    if (rc == RM_PF_E_REPLY) rm__errmsg_set("unexpected reply to script \"waitlist_join\"");
  }
  return rm__pf_count(pf, RM_PF_OP_JOIN, rc);
}

/* waitlist_fill and stock_add: ARGV = ticket type, deadline, scan, cap,
 * then 'extra' (stock_add's bucket count and stocks), then the order ids;
 * the reply is the users handled. */
static int fill_eval(rm_prefilter_t *pf, rm_pf_op_t op, int script, const rm_pf_keys_t *ks, int32_t ticket_type,
                     const int64_t *extra, size_t n_extra, const int64_t *order_ids, size_t n_ids,
                     int64_t deadline_ms, rm_pf_fill_t *out, size_t cap, size_t *n_out) {
  const char *name = rm__pf_script_name(script);
  char(*strs)[24] = NULL;
  const char **args = NULL;
  char err[200];
  redisReply *r = NULL;
  size_t nargs = 4 + n_extra + n_ids;
  if (deadline_ms == 0) deadline_ms = rm__pf_unix_ms() + (int64_t)pf->opts.freeze_ttl_ms;
  strs = malloc(nargs * sizeof(*strs));
  args = malloc(nargs * sizeof(*args));
  if (!strs || !args) {
    free(strs);
    free(args);
    rm__errmsg_set("out of memory");
    return rm__pf_count(pf, op, RM_E_NOMEM);
  }
  rm__pf_i64_str(strs[0], ticket_type);
  rm__pf_i64_str(strs[1], deadline_ms);
  rm__pf_i64_str(strs[2], RM_PF_MAX_FILL_SCAN);
  rm__pf_i64_str(strs[3], (int64_t)cap);
  for (size_t i = 0; i < n_extra; i++) rm__pf_i64_str(strs[4 + i], extra[i]);
  for (size_t i = 0; i < n_ids; i++) rm__pf_i64_str(strs[4 + n_extra + i], order_ids[i]);
  for (size_t i = 0; i < nargs; i++) args[i] = strs[i];
  const char *keys[] = {ks->k[RM_PF_K_META],   ks->k[RM_PF_K_STOCK], ks->k[RM_PF_K_BOUGHT],
                        ks->k[RM_PF_K_ORDERS], ks->k[RM_PF_K_EXPIRY], ks->k[RM_PF_K_WL],
                        ks->k[RM_PF_K_WLQ]};
  int rc = rm__pf_eval(&pf->pool, script, 7, keys, (int)nargs, (const char *const *)args, &r);
  free(args);
  free(strs);
  if (rc == 0) {
    rc = rm__pf_parse_fill(r, out, cap, n_out, err, sizeof(err));
    freeReplyObject(r);
    if (rc == RM_PF_E_REDIS) rm__errmsg_set("Redis refused script \"%s\": %s", name, err);
    if (rc == RM_PF_E_REPLY) rm__errmsg_set("unexpected reply to script \"%s\"", name);
  }
  return rm__pf_count(pf, op, rc);
}

int rm_prefilter_waitlist_fill(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                               const int64_t *order_ids, size_t n_ids, int64_t deadline_ms,
                               rm_pf_fill_t *out, size_t cap, size_t *n_out) {
  rm_pf_keys_t ks;
  if (n_out) *n_out = 0;
  if (!pf) return RM_E_INVALID;
  if (!n_out || !out || !order_ids || n_ids < 1 || n_ids > RM_PF_MAX_FILL_IDS || cap < 1 ||
      cap > RM_PF_MAX_RESULTS || rm__pf_keys_build(&ks, activity_id, ticket_type) != 0 ||
      (deadline_ms != 0 && !rm__pf_ms_ok(deadline_ms)))
    return bad_args(pf, RM_PF_OP_FILL, "waitlist fill needs an activity id >= 1, a ticket type >= 0, "
                                       "1 to 1000 order ids and room for 1 to 10000 results");
  for (size_t i = 0; i < n_ids; i++)
    if (!rm__pf_id_ok(order_ids[i])) return bad_args(pf, RM_PF_OP_FILL, "order ids must be >= 1");
  return fill_eval(pf, RM_PF_OP_FILL, RM_PF_S_WAITLIST_FILL, &ks, ticket_type, NULL, 0, order_ids, n_ids,
                   deadline_ms, out, cap, n_out);
}

int rm_prefilter_stock_add(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                           const int64_t *bucket_stock, size_t n_buckets, const int64_t *order_ids,
                           size_t n_ids, int64_t deadline_ms, rm_pf_fill_t *out, size_t cap, size_t *n_out) {
  rm_pf_keys_t ks;
  if (n_out) *n_out = 0;
  if (!pf) return RM_E_INVALID;
  if (!n_out || !out || !bucket_stock || n_buckets < 1 || n_buckets > RM_PF_MAX_BUCKETS ||
      (n_ids && !order_ids) || n_ids > RM_PF_MAX_FILL_IDS || cap < 1 || cap > RM_PF_MAX_RESULTS ||
      rm__pf_keys_build(&ks, activity_id, ticket_type) != 0 || (deadline_ms != 0 && !rm__pf_ms_ok(deadline_ms)))
    return bad_args(pf, RM_PF_OP_ADD, "stock add needs an activity id >= 1, a ticket type >= 0, 1 to 100000 "
                                      "buckets, 0 to 1000 order ids and room for 1 to 10000 results");
  for (size_t i = 0; i < n_buckets; i++)
    if (bucket_stock[i] < 0 || bucket_stock[i] > INT32_MAX)
      return bad_args(pf, RM_PF_OP_ADD, "a bucket's stock must be 0 .. 2^31-1");
  for (size_t i = 0; i < n_ids; i++)
    if (!rm__pf_id_ok(order_ids[i])) return bad_args(pf, RM_PF_OP_ADD, "order ids must be >= 1");
  int64_t *extra = malloc((n_buckets + 1) * sizeof(*extra));
  if (!extra) {
    rm__errmsg_set("out of memory");
    return rm__pf_count(pf, RM_PF_OP_ADD, RM_E_NOMEM);
  }
  extra[0] = (int64_t)n_buckets;
  memcpy(extra + 1, bucket_stock, n_buckets * sizeof(*extra));
  int rc = fill_eval(pf, RM_PF_OP_ADD, RM_PF_S_STOCK_ADD, &ks, ticket_type, extra, n_buckets + 1, order_ids, n_ids,
                     deadline_ms, out, cap, n_out);
  free(extra);
  return rc;
}

/* ------------------------------------------------------ stats, shas --- */

static void counts_get(rm_prefilter_t *pf, rm_pf_op_t op, rm_pf_counts_t *c) {
  atomic_uint_fast64_t *v = pf->counts[op];
#define RM_PF_COUNTER_LOAD(name, field) c->field = atomic_load(&v[RM_PF_C_##name]);
  RM_PF_COUNTERS(RM_PF_COUNTER_LOAD)
#undef RM_PF_COUNTER_LOAD
}

void rm_prefilter_stats(rm_prefilter_t *pf, rm_pf_stats_t *out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  if (!pf) return;
  counts_get(pf, RM_PF_OP_FREEZE, &out->freeze);
  counts_get(pf, RM_PF_OP_CONFIRM, &out->confirm);
  counts_get(pf, RM_PF_OP_RELEASE, &out->release);
  counts_get(pf, RM_PF_OP_JOIN, &out->waitlist_join);
  counts_get(pf, RM_PF_OP_FILL, &out->waitlist_fill);
  counts_get(pf, RM_PF_OP_ADD, &out->stock_add);
  counts_get(pf, RM_PF_OP_EXPIRE, &out->expire);
  out->connects = atomic_load(&pf->pool.connects);
  out->connect_failures = atomic_load(&pf->pool.connect_failures);
  out->noscript_reloads = atomic_load(&pf->pool.noscript_reloads);
  out->stale_closed = atomic_load(&pf->pool.stale_closed);
  out->open_connections = rm__pf_pool_open(&pf->pool);
}

int rm_prefilter_script_sha(rm_prefilter_t *pf, const char *name, char *sha) {
  int idx = rm__pf_script_index(name);
  if (!pf || !sha || idx < 0) return RM_E_INVALID;
  return rm__pf_script_sha(&pf->pool, idx, sha);
}
