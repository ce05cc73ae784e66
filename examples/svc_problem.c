/*
 * svc_problem.c - RFC 9457 problem objects for the services' error
 * answers (svc_problem.h).
 */
#include "svc_problem.h"

#include <stdio.h>
#include <string.h>

/* The problems the services answer, by their "error" word: a title per
 * type (RFC 9457 3.1.3: the same for every occurrence).  examples/openapi/
 * lists the same words. */
static const struct {
  const char *error, *title;
} titles[] = {
  {"bad_request", "Bad request"},
  {"bad_json", "Body is not a JSON object"},
  {"unauthorized", "Order token required"},
  {"unauthenticated", "Not authenticated"},
  {"forbidden", "Not this order's token"},
  {"admin_disabled", "Admin calls disabled"},
  {"not_found", "Not found"},
  {"unknown_activity", "Unknown activity"},
  {"unknown_order", "Unknown order"},
  {"no_buckets", "No buckets of this ticket type"},
  {"no_bucket", "No such bucket"},
  {"method_not_allowed", "Method not allowed"},
  {"rejected", "Order refused"},
  {"sold_out", "Sold out"},
  {"over_limit", "Over the user's limit"},
  {"not_on_sale", "Not on sale"},
  {"invalid", "Invalid order"},
  {"mismatch", "Freeze does not match the order"},
  {"bad_state", "Order is not unpaid"},
  {"in_progress", "Request with this key in progress"},
  {"idempotency_key_reused", "Idempotency key reused"},
  {"key_reused", "Addition key reused"},
  {"sale_ended", "Sale ended"},
  {"at_mode", "Not in AT image mode"},
  {"confirmed", "Freeze already confirmed"},
  {"released", "Freeze already released"},
  {"not_frozen", "Tickets not frozen"},
  {"global_not_active", "Global transaction not active"},
  {"duplicate", "Operation already done"},
  {"body_too_large", "Body too large"},
  {"internal", "Internal error"},
  {"not_implemented", "Not implemented"},
  {"unavailable", "Service unavailable"},
  {"unknown_outcome", "Outcome unknown"},
  {"not_ready", "Order not ready"},
  {"shutting_down", "Shutting down"},
};

static const struct {
  int status;
  const char *phrase;
} phrases[] = {
  {400, "Bad Request"},        {401, "Unauthorized"},          {403, "Forbidden"},
  {404, "Not Found"},          {405, "Method Not Allowed"},    {409, "Conflict"},
  {413, "Content Too Large"},  {422, "Unprocessable Content"}, {500, "Internal Server Error"},
  {501, "Not Implemented"},    {503, "Service Unavailable"},
};

const char *svc_problem_reason_phrase(int status) {
  for (size_t i = 0; i < sizeof(phrases) / sizeof(phrases[0]); i++)
    if (phrases[i].status == status) return phrases[i].phrase;
  return NULL;
}

const char *svc_problem_title(const char *error, int status) {
  for (size_t i = 0; error && i < sizeof(titles) / sizeof(titles[0]); i++)
    if (strcmp(titles[i].error, error) == 0) return titles[i].title;
  const char *p = svc_problem_reason_phrase(status);
  return p ? p : "Error";
}

/* A word fit for the type URI: 1 to 48 of [a-z0-9_]. */
static bool word_ok(const char *w) {
  size_t n = 0;
  for (; w && w[n]; n++)
    if (!((w[n] >= 'a' && w[n] <= 'z') || (w[n] >= '0' && w[n] <= '9') || w[n] == '_') || n >= 48) return false;
  return n > 0;
}

/* Set the members of a problem on 'o' that it lacks.  False when out of
 * memory. */
static bool fill(json_t *o, int status, const char *error, const char *detail) {
  char type[sizeof(SVC_PROBLEM_TYPE_PREFIX) + 48];
  snprintf(type, sizeof(type), SVC_PROBLEM_TYPE_PREFIX "%s", error);
  const char *title = svc_problem_title(error, status);
  int rc = 0;
  if (!json_is_string(json_object_get(o, "type"))) rc |= json_object_set_new(o, "type", json_string(type));
  if (!json_is_string(json_object_get(o, "title"))) rc |= json_object_set_new(o, "title", json_string(title));
  if (!json_is_integer(json_object_get(o, "status"))) rc |= json_object_set_new(o, "status", json_integer(status));
  if (!json_is_string(json_object_get(o, "detail"))) {
    /* 'detail' may come from anywhere (a library's message): not valid
     * UTF-8 makes no JSON string, and then the title stands */
    json_t *d = detail ? json_string(detail) : NULL;
    rc |= json_object_set_new(o, "detail", d ? d : json_string(title));
  }
  if (!json_is_string(json_object_get(o, "error"))) rc |= json_object_set_new(o, "error", json_string(error));
  return rc == 0;
}

json_t *svc_problem_new(int status, const char *error, const char *detail) {
  if (!word_ok(error)) error = "error";
  json_t *o = json_object();
  if (!o) return NULL;
  if (!fill(o, status, error, detail)) {
    json_decref(o);
    return NULL;
  }
  return o;
}

json_t *svc_problem_rejected(const char *reason) {
  const char *detail = "the order was refused";
  if (reason && strcmp(reason, "sold_out") == 0)
    detail = "no tickets of this ticket type are left";
  else if (reason && strcmp(reason, "over_limit") == 0)
    detail = "the user would hold more tickets of this activity than its limit allows";
  else if (reason && strcmp(reason, "not_on_sale") == 0)
    detail = "the activity's sale is not open (not started, paused or ended)";
  json_t *o = svc_problem_new(409, "rejected", detail);
  if (o && json_object_set_new(o, "reason", json_string(word_ok(reason) ? reason : "error")) != 0) {
    json_decref(o);
    return NULL;
  }
  return o;
}

json_t *svc_problem_complete(json_t *body, int status) {
  if (!json_is_object(body)) {
    json_decref(body);
    return svc_problem_new(status, "internal", NULL);
  }
  const char *error = json_string_value(json_object_get(body, "error"));
  /* a "status" that is not the HTTP status (a word: the order's, in
   * answers stored before this shape) moves to "order_status" */
  json_t *st = json_object_get(body, "status");
  if (st && !json_is_integer(st)) {
    json_object_set(body, "order_status", st);
    json_object_del(body, "status");
  }
  if (!fill(body, status, word_ok(error) ? error : "error", NULL)) {
    json_decref(body);
    return NULL;
  }
  return body;
}

bool svc_problem_ok(const json_t *body, int status) {
  const char *type = json_string_value(json_object_get(body, "type"));
  return type && strncmp(type, SVC_PROBLEM_TYPE_PREFIX, strlen(SVC_PROBLEM_TYPE_PREFIX)) == 0 &&
         json_is_string(json_object_get(body, "title")) && json_is_string(json_object_get(body, "detail")) &&
         json_is_string(json_object_get(body, "error")) &&
         json_integer_value(json_object_get(body, "status")) == status;
}
