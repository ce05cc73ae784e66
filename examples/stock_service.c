/*
 * stock_service.c - stock-service of the flash-sale demo: the second
 * branch of every purchase, on the stock database.
 *
 * NOTES
 *   HTTP API (JSON bodies; every call carries the global transaction id in
 *   the X-Txc-Xid header and runs as one AT branch of that transaction):
 *
 *     POST /freeze  {order_id, activity, ticket_type, bucket, qty}
 *          frozen_count += qty on the bucket row, guarded by
 *          stock - frozen_count - sold_count >= qty (delta mode: the undo
 *          is frozen_count -= qty, which commutes with the other freezes,
 *          so concurrent freezes of one bucket take no global row lock)
 *          200 {bucket, branch_id} | 409 {error: sold_out}
 *     POST /confirm (same body) frozen_count -= qty, sold_count += qty
 *          200 | 409 {error: not_frozen}
 *     POST /release (same body) frozen_count -= qty
 *          200 | 409 {error: not_frozen}
 *     GET  /healthz  200 {ok, tc_nodes_up}
 *
 *   Each operation also inserts its stock_log row (UNIQUE (order_id, op))
 *   in the same branch, so an operation happens at most once per order
 *   (a repeat answers 409 {error: duplicate}) and a rolled-back global
 *   transaction takes its log row away with its counter change.
 *
 *   Errors: 400 bad request, 404 no such bucket, 409 as above or
 *   global_not_active (the global transaction was already decided), 503
 *   when the branch could not be done (coordinator, lock wait or database
 *   trouble): the caller rolls the global transaction back.
 *
 *   Settings (environment, as printed by cluster/local/up): STOCK_PG_URL,
 *   TC_NODES, TC_TOKEN; STOCK_LISTEN (host:port, default 127.0.0.1:0 = any
 *   free port), STOCK_THREADS (default 8 per CPU), STOCK_RESOURCE_ID
 *   (default "stock"), STOCK_LOG_LEVEL.  --listen and --url-file FILE (the
 *   service writes its URL there once it serves: how scripts find a port
 *   chosen by the kernel) override them.  SIGTERM/SIGINT: stop accepting,
 *   finish the requests in progress, close, exit 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "svc_common.h"
#include "svc_http.h"

#define FREEZE_GUARD "stock - frozen_count - sold_count >= $1"
#define UNFREEZE_GUARD "frozen_count + $1 >= 0"

typedef struct stock_svc {
  rm_client_t *rm;
  svc_pgpool_t *pool;
  const char *resource;
} stock_svc_t;

typedef enum { OP_FREEZE, OP_CONFIRM, OP_RELEASE } stock_opkind_t;
static const char *const op_names[] = {"freeze", "confirm", "release"};

typedef struct stock_op {
  stock_opkind_t kind;
  long long order_id, activity, ticket_type, bucket, qty;
} stock_op_t;

/* Validate the body of /freeze, /confirm and /release into 'op'. */
static bool parse_op_or_reply(const svc_req_t *req, svc_resp_t *resp, stock_op_t *op) {
  json_error_t je;
  json_t *o = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(o)) {
    svc_resp_error(resp, 400, "bad_json", o ? "the body must be a JSON object" : je.text);
    json_decref(o);
    return false;
  }
  const char *bad = NULL;
  if (!svc_json_int(o, "order_id", 1, INT64_MAX, &op->order_id))
    bad = "order_id must be a positive integer";
  else if (!svc_json_int(o, "activity", 1, INT64_MAX, &op->activity))
    bad = "activity must be a positive integer";
  else if (!svc_json_int(o, "ticket_type", 0, INT32_MAX, &op->ticket_type))
    bad = "ticket_type must be an integer >= 0";
  else if (!svc_json_int(o, "bucket", 0, INT32_MAX, &op->bucket))
    bad = "bucket must be an integer >= 0";
  else if (!svc_json_int(o, "qty", 1, 1000, &op->qty))
    bad = "qty must be an integer from 1 to 1000";
  json_decref(o);
  if (bad) {
    svc_resp_error(resp, 400, "bad_request", bad);
    return false;
  }
  return true;
}

/* The statements of one operation inside branch 'b'. */
static int op_statements(rm_branch_t *b, const stock_op_t *op, const char *xid) {
  char sa[24], st[24], sb[24], so[24], sq[24];
  snprintf(sa, sizeof(sa), "%lld", op->activity);
  snprintf(st, sizeof(st), "%lld", op->ticket_type);
  snprintf(sb, sizeof(sb), "%lld", op->bucket);
  snprintf(so, sizeof(so), "%lld", op->order_id);
  snprintf(sq, sizeof(sq), "%lld", op->qty);
  const char *pk[3] = {sa, st, sb};
  int rc;
  switch (op->kind) {
  case OP_FREEZE:
    rc = rm_at_update_delta(b, "activity_ticket_bucket", pk, "frozen_count", op->qty, FREEZE_GUARD);
    break;
  case OP_CONFIRM:
    /* frozen first: the row's CHECK (frozen + sold <= stock) holds after
     * each statement */
    rc = rm_at_update_delta(b, "activity_ticket_bucket", pk, "frozen_count", -op->qty, UNFREEZE_GUARD);
    if (rc == 0) rc = rm_at_update_delta(b, "activity_ticket_bucket", pk, "sold_count", op->qty, NULL);
    break;
  default:
    rc = rm_at_update_delta(b, "activity_ticket_bucket", pk, "frozen_count", -op->qty, UNFREEZE_GUARD);
    break;
  }
  if (rc != 0) return rc;
  static const char *const cols[] = {"activity_id", "ticket_type", "bucket_id", "order_id", "op", "qty", "xid"};
  const char *vals[] = {sa, st, sb, so, op_names[op->kind], sq, xid};
  return rm_at_insert(b, "stock_log", 7, cols, vals);
}

static void handle_op(stock_svc_t *s, const svc_req_t *req, svc_resp_t *resp, stock_opkind_t kind) {
  stock_op_t op = {.kind = kind};
  const char *xid = svc_req_header(req, SVC_XID_HEADER);
  if (!xid || !*xid || strlen(xid) >= RM_XID_MAX) {
    svc_resp_error(resp, 400, "bad_request", "the " SVC_XID_HEADER " header must carry the global transaction id");
    return;
  }
  if (!parse_op_or_reply(req, resp, &op)) return;

  char err[512];
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  if (!pg) {
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:s}", "xid", xid), "could not %s stock: %s", op_names[kind], err);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  rm_branch_t *b = NULL;
  int64_t bid = 0;
  int rc;
  if (!svc_pg_exec(pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, err, sizeof(err))) {
    rc = RM_E_DB;
    goto fail;
  }
  if ((rc = rm_at_open(s->rm, xid, s->resource, pg, &b)) != 0) {
    snprintf(err, sizeof(err), "%s", rm_strerror(rc));
    goto fail;
  }
  if ((rc = op_statements(b, &op, xid)) != 0 || (rc = rm_at_prepare(b, &bid)) != 0) {
    snprintf(err, sizeof(err), "%s: %s", rm_strerror(rc), rm_at_errmsg(b));
    goto fail;
  }
  PGresult *r = PQexec(pg, "COMMIT");
  bool committed = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
  if (!committed) snprintf(err, sizeof(err), "local commit failed: %s", PQresultErrorMessage(r));
  PQclear(r);
  rm_at_close(b, committed);
  svc_pg_put(s->pool, pg);
  if (!committed) {
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:I}", "xid", xid, "order_id", (json_int_t)op.order_id),
            "could not %s stock: %s", op_names[kind], err);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  SVC_LOG(SVC_LOG_DEBUG,
          json_pack("{s:s,s:I,s:I,s:I}", "xid", xid, "order_id", (json_int_t)op.order_id, "bucket",
                    (json_int_t)op.bucket, "branch_id", (json_int_t)bid),
          "%s done", op_names[kind]);
  svc_resp_json(resp, 200, json_pack("{s:b,s:I,s:I}", "ok", 1, "bucket", (json_int_t)op.bucket, "branch_id",
                                     (json_int_t)bid));
  return;

fail:
  if (PQtransactionStatus(pg) != PQTRANS_IDLE) PQclear(PQexec(pg, "ROLLBACK"));
  if (b) rm_at_close(b, false);
  svc_pg_put(s->pool, pg);
  int status = 503;
  const char *reason = "unavailable";
  switch (rc) {
  case RM_E_GUARD:
    status = 409;
    reason = kind == OP_FREEZE ? "sold_out" : "not_frozen";
    break;
  case RM_E_NOT_ONE_ROW:
    status = 404;
    reason = "no_bucket";
    break;
  case RM_E_GLOBAL_NOT_ACTIVE:
  case RM_E_GLOBAL_NOT_FOUND:
  case RM_E_TIMED_OUT:
    status = 409;
    reason = "global_not_active";
    break;
  case RM_E_INVALID:
    status = 400;
    reason = "bad_request";
    break;
  case RM_E_DB:
    if (strstr(err, "stock_log_order_op_key")) {
      status = 409;
      reason = "duplicate";
    }
    break;
  default:
    break;
  }
  SVC_LOG(status == 409 && rc == RM_E_GUARD ? SVC_LOG_DEBUG : SVC_LOG_WARN,
          json_pack("{s:s,s:I,s:I,s:s}", "xid", xid, "order_id", (json_int_t)op.order_id, "bucket",
                    (json_int_t)op.bucket, "reason", reason),
          "could not %s stock: %s", op_names[kind], err);
  svc_resp_error(resp, status, reason, err);
}

static void handler(const svc_req_t *req, svc_resp_t *resp, void *arg) {
  stock_svc_t *s = arg;
  bool post = strcmp(req->method, "POST") == 0;
  if (strcmp(req->path, "/freeze") == 0 && post)
    handle_op(s, req, resp, OP_FREEZE);
  else if (strcmp(req->path, "/confirm") == 0 && post)
    handle_op(s, req, resp, OP_CONFIRM);
  else if (strcmp(req->path, "/release") == 0 && post)
    handle_op(s, req, resp, OP_RELEASE);
  else if (strcmp(req->path, "/healthz") == 0 && strcmp(req->method, "GET") == 0)
    svc_resp_json(resp, 200, json_pack("{s:b,s:i}", "ok", 1, "tc_nodes_up", rm_client_nodes_up(s->rm)));
  else if (strcmp(req->path, "/freeze") == 0 || strcmp(req->path, "/confirm") == 0 ||
           strcmp(req->path, "/release") == 0)
    svc_resp_error(resp, 405, "method_not_allowed", NULL);
  else
    svc_resp_error(resp, 404, "not_found", NULL);
}

/* Write 'url' to 'path' atomically (temporary file + rename). */
static bool write_url_file(const char *path, const char *url) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return false;
  bool ok = fprintf(f, "%s\n", url) > 0;
  ok = fclose(f) == 0 && ok;
  if (ok) ok = rename(tmp, path) == 0;
  if (!ok) unlink(tmp);
  return ok;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: stock-service [--listen HOST:PORT] [--url-file FILE]\n"
          "\n"
          "The stock branch of the flash-sale demo (see examples/stock_service.c).\n"
          "Environment: STOCK_PG_URL, TC_NODES, TC_TOKEN (from cluster/local/up),\n"
          "STOCK_LISTEN, STOCK_THREADS, STOCK_RESOURCE_ID, STOCK_LOG_LEVEL.\n");
}

int main(int argc, char **argv) {
  svc_log_init("stock-service", "STOCK_LOG_LEVEL");
  const char *listen = svc_env_str("STOCK_LISTEN", "127.0.0.1:0");
  const char *url_file = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
      listen = argv[++i];
    else if (strcmp(argv[i], "--url-file") == 0 && i + 1 < argc)
      url_file = argv[++i];
    else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 64;
    }
  }
  bool ok = true;
  int threads = (int)svc_env_int("STOCK_THREADS", 8LL * svc_ncpu(), 1, 1024, &ok);
  const char *pg_url = svc_env_str("STOCK_PG_URL", NULL);
  stock_svc_t s = {.resource = svc_env_str("STOCK_RESOURCE_ID", "stock")};
  if (!pg_url) {
    svc_error("STOCK_PG_URL is not set (it is printed by cluster/local/up)");
    ok = false;
  }
  if (!ok) return 78;

  svc_block_signals();
  if (!svc_http_global_init()) {
    svc_error("could not initialise libcurl");
    return 70;
  }
  int exit_code = 0;
  svc_http_t *http = NULL;
  if (svc_rm_client_new("stock-service", 5000, &s.rm) != 0) {
    exit_code = 69;
    goto out;
  }
  int rc = rm_resource_add(s.rm, s.resource, pg_url);
  if (rc != 0) {
    svc_error("could not add resource \"%s\": %s", s.resource, rm_strerror(rc));
    exit_code = 69;
    goto out;
  }
  /* One connection per pool thread: a request never waits for another's. */
  s.pool = svc_pgpool_new(pg_url, threads, "stock-service");
  if (!s.pool) {
    svc_error("out of memory");
    exit_code = 70;
    goto out;
  }
  char err[512];
  http = svc_http_start(listen, (unsigned)threads, handler, &s, err, sizeof(err));
  if (!http) {
    svc_error("%s", err);
    exit_code = 69;
    goto out;
  }
  char url[128];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d", svc_http_port(http));
  SVC_LOG(SVC_LOG_INFO, json_pack("{s:s,s:i,s:s}", "url", url, "threads", threads, "resource", s.resource),
          "stock-service ready");
  if (url_file && !write_url_file(url_file, url)) {
    svc_error("could not write the URL to \"%s\"", url_file);
    exit_code = 73;
    goto out;
  }
  int sig = svc_wait_signal();
  svc_info("stock-service stopping (signal %d)", sig);

out:
  svc_http_stop(http); /* waits for the requests in progress */
  svc_pgpool_free(s.pool);
  rm_client_free(s.rm);
  svc_http_global_cleanup();
  if (exit_code == 0) svc_info("stock-service stopped");
  return exit_code;
}
