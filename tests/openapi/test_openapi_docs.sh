#!/usr/bin/env bash
# test_openapi_docs.sh - the services' OpenAPI documents (examples/openapi/)
# in make test, without servers: each document is valid OpenAPI 3.1 with
# valid schemas (openapi_check.py lint), each service's --routes are
# exactly its document's operations, and the check catches wrong answers
# and broken documents (openapi_check.py selftest).  The answers of real
# running services are checked by tests/integration/test_openapi.sh.
#
# Needs TX_BIN_DIR (order-service, stock-service, event-consumers) and
# TX_SOURCE_DIR; set by ctest.
set -euo pipefail
src=${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}
bin=${TX_BIN_DIR:?TX_BIN_DIR not set}
# Debian's interpreter: python3-yaml and python3-jsonschema (scripts/deps)
py=/usr/bin/python3
[[ -x $py ]] || py=python3
check=$src/tests/openapi/openapi_check.py
docs=$src/examples/openapi
rc=0
"$py" "$check" lint "$docs/order-service.yaml" "$docs/stock-service.yaml" "$docs/event-consumers.yaml" || rc=1
for s in order-service stock-service event-consumers; do
  "$py" "$check" routes "$docs/$s.yaml" "$bin/$s" || rc=1
done
"$py" "$check" selftest "$docs/order-service.yaml" || rc=1
exit "$rc"
