/*
 * fuzz_event.c - libFuzzer target for the order-event decoder
 * (examples/svc_event.h): what a consumer reads from a Redis stream that
 * any program on the network could write to.
 *
 * The input is split at NUL bytes into at most 16 strings, taken as
 * field/value pairs (an odd last one is a value-less field).  Whatever the
 * bytes: no crash, no leak, and an accepted event is consistent (positive
 * ids, a known type, a payload object, the business key "<type>:<order>").
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "svc_event.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *buf = fuzz_cstr(data, size, 4096);
  if (!buf) return 0;
  const char *parts[16];
  size_t n = 0;
  for (size_t i = 0, start = 0; i <= size && n < 16; i++) {
    if (i == size || buf[i] == '\0') {
      parts[n++] = buf + start;
      start = i + 1;
    }
  }
  const char *k[8], *v[8];
  size_t pairs = 0;
  for (size_t i = 0; i < n; i += 2) {
    k[pairs] = parts[i];
    v[pairs] = i + 1 < n ? parts[i + 1] : NULL;
    pairs++;
  }
  svc_event_t ev = {0};
  json_t *pl = NULL;
  char biz[SVC_EVENT_BIZ_KEY_MAX], why[256] = "";
  if (svc_event_parse(k, v, pairs, &ev, &pl, biz, why, sizeof(why))) {
    CHECK(ev.event_id > 0 && ev.order_id > 0);
    /* one of the types the outbox writes (svc_event.h) */
    CHECK(strcmp(ev.type, "order.paid") == 0 || strcmp(ev.type, "order.cancelled") == 0 ||
          strcmp(ev.type, "order.expired") == 0 || strcmp(ev.type, "order.rejected") == 0 ||
          strcmp(ev.type, "waitlist.ordered") == 0 || strcmp(ev.type, "waitlist.refused") == 0);
    CHECK(json_is_object(pl) && ev.payload == pl);
    char want[SVC_EVENT_BIZ_KEY_MAX];
    snprintf(want, sizeof(want), "%s:%lld", ev.type, ev.order_id);
    CHECK(strcmp(ev.biz_key, want) == 0);
    json_decref(pl);
  } else {
    CHECK(pl == NULL && why[0] != '\0');
  }
  free(buf);
  return 0;
}
