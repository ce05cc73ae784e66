#!/usr/bin/env bash
# test_openapi.sh - the real answers of the running services against their
# OpenAPI documents (examples/openapi/, issue 29), on a real local cluster
# (cluster/local/up: PostgreSQL, Redis, 3 tcd nodes) with the real
# order-service, stock-service and event-consumers:
#
#   1. tests/openapi/exchange.py sends each service its requests: orders
#      made, replayed by their Idempotency-Key, read, paid, cancelled,
#      refused (over the limit, sold out), bad bodies, a body too large,
#      unknown paths, methods and activities, the order token missing or
#      another's, the waitlist, more tickets (admin), the mode switch; a
#      key another request holds (409 in_progress, Retry-After) and Redis
#      paused (503, Retry-After); stock-service's own calls signed with
#      the services' key (a local freeze, tickets, an activity, bad
#      signatures), and event-consumers' probes; it records every answer
#      and checks the conventions on the way (Location of a 201 leads to
#      the order, an unknown activity is 404, not 503);
#   2. tests/openapi/openapi_check.py check holds every recorded answer to
#      its service's document: the response of its status, its required
#      headers (Location, Allow, Retry-After, WWW-Authenticate), its
#      Content-Type (application/problem+json for every error) and its
#      body's schema, a problem's status and type.
# openapi_docs (tests/openapi/test_openapi_docs.sh) checks the documents
# themselves, and that the check catches wrong answers.
#
# Needs TX_BIN_DIR (tcd, order-service, stock-service, event-consumers,
# txc-compensate) and TX_SOURCE_DIR; set by ctest.
set -euo pipefail

TEST_NAME=test_openapi
# shellcheck source=tests/integration/services_harness.sh
. "${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}/tests/integration/services_harness.sh"
py=/usr/bin/python3 # Debian's: python3-yaml and python3-jsonschema (scripts/deps)
[[ -x $py ]] || py=python3

harness_cluster_up
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/admin.token")
export TXC_ADMIN_TOKEN_FILE=$tmp/admin.token
eval "$("$src/examples/services" start --bin "$bin" --dir "$CLUSTER_DIR")"
ok "cluster and services started ($ORDER_URL, $STOCK_URL, ${EVENTS_URL:-no event-consumers})"

# two activities on sale: 4 tickets (limit 2) for order-service's calls,
# 100 for stock-service's own
A=$(on_sale_activity 'openapi test' 1 4)
B=$(on_sale_activity 'openapi test' 1 100)
ok "activities $A and $B on sale"

rc=0
"$py" "$src/tests/openapi/exchange.py" "$tmp" "$A" "$B" || rc=$?
check "every answer was the one expected (status $rc)" test "$rc" -eq 0
for s in order-service stock-service event-consumers; do
  rc=0
  "$py" "$src/tests/openapi/openapi_check.py" check "$src/examples/openapi/$s.yaml" "$tmp/$s.jsonl" || rc=$?
  check "$s: every answer as its OpenAPI document says (status $rc)" test "$rc" -eq 0
done
[[ $failures -eq 0 ]] || exit 1
