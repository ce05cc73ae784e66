/*
 * svc_admin.c - the services' admin endpoint (svc_admin.h): the runtime
 * switch of the fallback to local mode.
 */
#include "svc_admin.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "svc_idem.h"
#include "txc_isotime.h"
#include "txc_secret.h"

#define TOKEN_MIN 16
#define TOKEN_MAX 256

struct svc_admin {
  rm_client_t *rm;         /* borrowed */
  const svc_auth_t *auth;  /* borrowed, may be NULL */
  char *token;             /* sodium_malloc'd, NULL: no admin token */
  size_t token_len;
  _Atomic unsigned long long changes[3]; /* by RM_MODE_*: auto, global, local */
  _Atomic unsigned long long refused_unauth, refused_bad, refused_disabled;
};

svc_admin_t *svc_admin_new(rm_client_t *rm, const svc_auth_t *auth) {
  svc_admin_t *a = calloc(1, sizeof(*a));
  if (!a) {
    svc_error("out of memory");
    return NULL;
  }
  a->rm = rm;
  a->auth = auth;
  const char *path = getenv("TXC_ADMIN_TOKEN_FILE");
  if (path && *path) {
    char err[512];
    if (sodium_init() < 0 || !(a->token = sodium_malloc(TOKEN_MAX))) {
      svc_error("could not set up the admin token: out of memory");
      free(a);
      return NULL;
    }
    if (txc_secret_read(path, a->token, TOKEN_MAX, err, sizeof(err)) != 0) {
      svc_error("could not read TXC_ADMIN_TOKEN_FILE: %s", err);
      svc_admin_free(a);
      return NULL;
    }
    a->token_len = strlen(a->token);
    if (a->token_len < TOKEN_MIN) {
      svc_error("the admin token in \"%s\" is %zu characters long: at least %d are needed", path, a->token_len,
                TOKEN_MIN);
      svc_admin_free(a);
      return NULL;
    }
  }
  if (!a->token && !a->auth)
    svc_warn("no admin credential (TXC_ADMIN_TOKEN_FILE, TXC_SERVICE_KEY_FILE): /admin/mode refuses every call");
  return a;
}

void svc_admin_free(svc_admin_t *a) {
  if (!a) return;
  if (a->token) sodium_free(a->token);
  free(a);
}

/* Who sent 'req': "admin-token", "service-key" (the signature; the body's
 * at_ms is checked later), or NULL. */
static const char *authenticate(const svc_admin_t *a, const svc_req_t *req) {
  const char *h = svc_req_header(req, "Authorization");
  if (a->token && h && strncmp(h, "Bearer ", 7) == 0) {
    const char *t = h + 7;
    size_t n = strlen(t);
    /* constant time in the token's contents (the length is not secret) */
    if (n == a->token_len && sodium_memcmp(t, a->token, n) == 0) return "admin-token";
  }
  if (a->auth && svc_req_header(req, SVC_AUTH_HEADER) && svc_http_verify(a->auth, req)) return "service-key";
  return NULL;
}

/* The answer: the mode in force, the forced and detected ones. */
static json_t *mode_json(const svc_admin_t *a, int previous) {
  rm_degrade_stats_t ds = {0};
  rm_client_degrade_stats(a->rm, &ds);
  json_t *j = json_pack("{s:b,s:s,s:s,s:s}", "ok", 1, "mode", rm_mode_name(ds.mode), "forced",
                        rm_mode_name(ds.forced), "detected", rm_mode_name(ds.detected));
  if (previous >= 0) json_object_set_new(j, "previous", json_string(rm_mode_name(previous)));
  return j;
}

static void refuse_what(svc_admin_t *a, svc_resp_t *resp, const char *what, int status, const char *reason,
                        const char *detail, const char *who) {
  if (status == 400)
    a->refused_bad++;
  else if (status == 403)
    a->refused_disabled++;
  else
    a->refused_unauth++;
  SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:s,s:s}", "admin", what, "who", who ? who : "", "reason", reason),
          "refused an admin call: %s", detail);
  svc_resp_error(resp, status, reason, detail);
  if (status == 401) svc_resp_header(resp, "WWW-Authenticate", "Bearer realm=\"admin\"");
}

static void refuse(svc_admin_t *a, svc_resp_t *resp, int status, const char *reason, const char *detail,
                   const char *who) {
  refuse_what(a, resp, "mode", status, reason, detail, who);
}

/* POST /admin/mode, authenticated as 'who'. */
static void set_mode(svc_admin_t *a, const svc_req_t *req, svc_resp_t *resp, const char *who) {
  json_error_t je;
  json_t *o = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  const char *bad = NULL;
  int mode = -1;
  const char *op = NULL;
  if (!json_is_object(o)) {
    bad = "the body must be a JSON object: {\"mode\": \"local\" | \"global\" | \"auto\"}";
  } else {
    const char *m = json_string_value(json_object_get(o, "mode"));
    json_t *jop = json_object_get(o, "operator");
    json_t *at = json_object_get(o, "at_ms");
    op = json_string_value(jop);
    void *it = json_object_iter(o);
    for (; it && !bad; it = json_object_iter_next(o, it)) {
      const char *k = json_object_iter_key(it);
      if (strcmp(k, "mode") != 0 && strcmp(k, "operator") != 0 && strcmp(k, "at_ms") != 0)
        bad = "unknown field (expected mode, operator, at_ms)";
    }
    if (bad) {
    } else if (!m || (strcmp(m, "local") != 0 && strcmp(m, "global") != 0 && strcmp(m, "auto") != 0)) {
      bad = "mode must be \"local\", \"global\" or \"auto\"";
    } else if (jop && (!op || !*op || strlen(op) > 64)) {
      bad = "operator must be a string of 1 to 64 characters";
    } else if (at && !json_is_integer(at)) {
      bad = "at_ms must be an integer (unix milliseconds)";
    } else if (strcmp(who, "service-key") == 0 &&
               (!at || llabs((long long)(json_integer_value(at) - txc_unix_ms())) > SVC_ADMIN_MAX_SKEW_MS)) {
      json_decref(o);
      refuse(a, resp, 401, "unauthenticated", "a signed admin call needs at_ms within 60 s of now (no replays)",
             who);
      return;
    } else {
      mode = rm_mode_parse(m);
    }
  }
  if (bad || mode < 0) {
    refuse(a, resp, 400, "bad_request", bad ? bad : "invalid mode", who);
    json_decref(o);
    return;
  }
  char opname[80];
  snprintf(opname, sizeof(opname), "%s", op ? op : "");
  json_decref(o);
  rm_degrade_stats_t before = {0};
  rm_client_degrade_stats(a->rm, &before);
  int rc = rm_client_force_mode(a->rm, mode);
  if (rc != 0) {
    svc_resp_error(resp, 500, "internal", rm_strerror(rc));
    return;
  }
  a->changes[mode]++;
  json_t *ans = mode_json(a, before.forced);
  SVC_LOG(SVC_LOG_WARN,
          json_pack("{s:s,s:s,s:s,s:s,s:s,s:O,s:O}", "admin", "mode", "who", who, "operator", opname, "previous",
                    rm_mode_name(before.forced), "forced", rm_mode_name(mode), "mode", json_object_get(ans, "mode"),
                    "detected", json_object_get(ans, "detected")),
          mode == RM_MODE_AUTO ? "transaction mode handed back to detection (auto)" : "transaction mode forced to %s",
          rm_mode_name(mode));
  svc_resp_json(resp, 200, ans);
}

const char *svc_admin_check(svc_admin_t *a, const svc_req_t *req, svc_resp_t *resp, const char *what) {
  if (!a || (!a->token && !a->auth)) {
    if (a)
      refuse_what(a, resp, what, 403, "admin_disabled", "no admin credential is configured in this service", NULL);
    else
      svc_resp_error(resp, 403, "admin_disabled", NULL);
    return NULL;
  }
  const char *who = authenticate(a, req);
  if (!who) {
    refuse_what(a, resp, what, 401, "unauthenticated",
                "an admin call needs Authorization: Bearer <TXC_ADMIN_TOKEN_FILE's token> or the services' signature",
                NULL);
    return NULL;
  }
  if (strcmp(who, "service-key") == 0) {
    json_t *o = json_loadb(req->body, req->body_len, 0, NULL);
    json_t *at = json_object_get(o, "at_ms");
    bool fresh = json_is_integer(at) && llabs((long long)(json_integer_value(at) - txc_unix_ms())) <= SVC_ADMIN_MAX_SKEW_MS;
    json_decref(o);
    if (!fresh) {
      refuse_what(a, resp, what, 401, "unauthenticated",
                  "a signed admin call needs at_ms within 60 s of now (no replays)", who);
      return NULL;
    }
  }
  return who;
}

bool svc_admin_handle(svc_admin_t *a, const svc_req_t *req, svc_resp_t *resp) {
  if (strncmp(req->path, "/admin/", 7) != 0) return false;
  if (strcmp(req->path, "/admin/mode") != 0) {
    svc_resp_error(resp, 404, "not_found", NULL);
    return true;
  }
  bool post = strcmp(req->method, "POST") == 0, get = strcmp(req->method, "GET") == 0;
  if (!post && !get) {
    svc_resp_error(resp, 405, "method_not_allowed", NULL);
    return true;
  }
  if (!a || (!a->token && !a->auth)) {
    if (a) refuse(a, resp, 403, "admin_disabled", "no admin credential is configured in this service", NULL);
    else svc_resp_error(resp, 403, "admin_disabled", NULL);
    return true;
  }
  const char *who = authenticate(a, req);
  if (!who) {
    refuse(a, resp, 401, "unauthenticated",
           "an admin call needs Authorization: Bearer <TXC_ADMIN_TOKEN_FILE's token> or the services' signature",
           NULL);
    return true;
  }
  if (get)
    svc_resp_json(resp, 200, mode_json(a, -1));
  else
    set_mode(a, req, resp, who);
  return true;
}

void svc_admin_metrics(svc_admin_t *a, txc_buf_t *b, bool with_mode) {
  if (!a) return;
  if (with_mode) {
    rm_degrade_stats_t ds = {0};
    rm_client_degrade_stats(a->rm, &ds);
    txc_buf_printf(b,
                   "# HELP txc_client_mode Current transaction mode (1 = the labelled mode).\n"
                   "# TYPE txc_client_mode gauge\n"
                   "txc_client_mode{mode=\"global\"} %d\ntxc_client_mode{mode=\"local\"} %d\n"
                   "# HELP txc_client_mode_forced The transaction mode forced by an operator: 0 auto (detection decides), 1 global, 2 local.\n"
       "# TYPE txc_client_mode_forced gauge\ntxc_client_mode_forced %d\n",
                   ds.mode == RM_MODE_GLOBAL, ds.mode == RM_MODE_LOCAL, ds.forced);
  }
  txc_buf_printf(b,
                 "# HELP txc_admin_mode_changes_total Transaction modes set through POST /admin/mode.\n"
                 "# TYPE txc_admin_mode_changes_total counter\n"
                 "txc_admin_mode_changes_total{mode=\"auto\"} %llu\n"
                 "txc_admin_mode_changes_total{mode=\"global\"} %llu\n"
                 "txc_admin_mode_changes_total{mode=\"local\"} %llu\n"
                 "# HELP txc_admin_refused_total Admin calls refused, by reason.\n"
                 "# TYPE txc_admin_refused_total counter\n"
                 "txc_admin_refused_total{reason=\"unauthenticated\"} %llu\n"
                 "txc_admin_refused_total{reason=\"bad_request\"} %llu\n"
                 "txc_admin_refused_total{reason=\"disabled\"} %llu\n",
                 (unsigned long long)a->changes[RM_MODE_AUTO], (unsigned long long)a->changes[RM_MODE_GLOBAL],
                 (unsigned long long)a->changes[RM_MODE_LOCAL], (unsigned long long)a->refused_unauth,
                 (unsigned long long)a->refused_bad, (unsigned long long)a->refused_disabled);
}

const char *svc_tickets_parse(const json_t *in, bool with_activity, svc_tickets_t *t) {
  *t = (svc_tickets_t){0};
  if (!json_is_object(in)) return "the body must be a JSON object";
  if (with_activity && !svc_json_int(in, "activity", 1, INT64_MAX, &t->activity))
    return "activity must be a positive integer";
  if (!svc_json_int(in, "ticket_type", 0, INT32_MAX, &t->ticket_type)) return "ticket_type must be an integer >= 0";
  if (!svc_json_int(in, "qty", 1, 1000000, &t->qty)) return "qty must be an integer from 1 to 1000000";
  t->key = json_string_value(json_object_get(in, "key"));
  if (!t->key || !svc_idem_key_ok(t->key))
    return "key must be 1 to 64 of A-Za-z0-9._:- (the addition's name: a repeat adds nothing)";
  json_t *op = json_object_get(in, "operator");
  t->op = json_string_value(op);
  if (op && (!t->op || !*t->op || strlen(t->op) > 64)) return "operator must be a string of 1 to 64 characters";
  return NULL;
}
