/*
 * svc_event.c - decoding an order event (svc_event.h).
 */
#include "svc_event.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "svc_parse.h"

static const char *const known_types[] = {"order.paid",       "order.cancelled",  "order.expired",
                                          "order.rejected",   "waitlist.ordered", "waitlist.refused"};

bool svc_event_parse(const char *const *fields, const char *const *values, size_t n, svc_event_t *ev,
                     json_t **payload, char biz[SVC_EVENT_BIZ_KEY_MAX], char *why, size_t whylen) {
  static const char *const names[4] = {"event_id", "type", "order_id", "payload"};
  const char *v[4] = {NULL, NULL, NULL, NULL};
  *payload = NULL;
  for (size_t i = 0; i < n; i++) {
    if (!fields[i] || !values[i]) {
      snprintf(why, whylen, "malformed event: a field without a value");
      return false;
    }
    for (int k = 0; k < 4; k++) {
      if (strcmp(fields[i], names[k]) != 0) continue;
      if (v[k]) {
        snprintf(why, whylen, "malformed event: field %s repeated", names[k]);
        return false;
      }
      v[k] = values[i];
    }
  }
  long long e = 0, o = 0;
  if (!v[0] || !svc_parse_ll(v[0], 1, INT64_MAX, &e) || !v[2] || !svc_parse_ll(v[2], 1, INT64_MAX, &o)) {
    snprintf(why, whylen, "malformed event: event_id and order_id must be positive integers");
    return false;
  }
  const char *type = NULL;
  for (size_t k = 0; v[1] && k < sizeof(known_types) / sizeof(known_types[0]); k++)
    if (strcmp(v[1], known_types[k]) == 0) type = known_types[k];
  if (!type) {
    snprintf(why, whylen, "malformed event: unknown type \"%.40s\"", v[1] ? v[1] : "");
    return false;
  }
  json_error_t je;
  json_t *j = v[3] ? json_loads(v[3], JSON_REJECT_DUPLICATES, &je) : NULL;
  long long activity = 0, user = 0, qty = 0, tt = 0, bucket = 0;
  if (!json_is_object(j) || !svc_json_int(j, "activity", 1, INT64_MAX, &activity) ||
      !svc_json_int(j, "user", 1, INT64_MAX, &user) || !svc_json_int(j, "qty", 1, 10000, &qty) ||
      !svc_json_int(j, "ticket_type", 0, INT32_MAX, &tt) || !svc_json_int(j, "bucket", 0, INT32_MAX, &bucket)) {
    json_decref(j);
    snprintf(why, whylen, "malformed event: the payload must be a JSON object with activity, ticket_type, bucket,"
                          " user and qty in range");
    return false;
  }
  ev->event_id = e;
  ev->order_id = o;
  ev->type = type;
  ev->payload = j;
  snprintf(biz, SVC_EVENT_BIZ_KEY_MAX, "%s:%lld", type, o);
  ev->biz_key = biz;
  *payload = j;
  return true;
}

void svc_event_sign(const svc_auth_t *a, const char *event_id, const char *type, const char *order_id,
                    const char *payload, char out[SVC_AUTH_HEX_MAX]) {
  const char *parts[5] = {"order-event", event_id, type, order_id, payload};
  size_t lens[5];
  for (int i = 0; i < 5; i++) lens[i] = strlen(parts[i]);
  svc_auth_sign(a, parts, lens, 5, out);
}

bool svc_event_verify(const svc_auth_t *a, const char *event_id, const char *type, const char *order_id,
                      const char *payload, const char *mac) {
  if (!event_id || !type || !order_id || !payload || !mac) return false;
  const char *parts[5] = {"order-event", event_id, type, order_id, payload};
  size_t lens[5];
  for (int i = 0; i < 5; i++) lens[i] = strlen(parts[i]);
  return svc_auth_verify(a, parts, lens, 5, mac);
}
