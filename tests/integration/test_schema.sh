#!/usr/bin/env bash
# test_schema.sh - integration test of the schemas in sql/ and scripts/db-migrate.
#
# Usage: scripts/with-servers --pg -- tests/integration/test_schema.sh
#
# Needs TC_PG_URL, ORDERS_PG_URL, STOCK_PG_URL and EVENTS_PG_URL of databases
# prepared by scripts/pg-tmp (all schemas applied).  Checks that every table exists, that
# re-running db-migrate changes nothing, that the constraints the invariants
# rely on reject bad rows (bucket oversell, duplicate undo row, second lock
# holder), that lock keys are stored whole, and that db-migrate is ordered,
# atomic per file, safe to run concurrently and clear about bad input.
# Prints one line per check and finally "N passed, M failed"; exits 1 if any
# check failed.  Leaves the tables of the four databases as it found them
# (it works in transactions it rolls back, and in a scratch database).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
migrate=$root/scripts/db-migrate

for v in TC_PG_URL ORDERS_PG_URL STOCK_PG_URL EVENTS_PG_URL; do
  if [[ -z ${!v:-} ]]; then
    echo "test_schema: $v is not set; run me as: scripts/with-servers --pg -- $0" >&2
    exit 2
  fi
done

export PGOPTIONS="${PGOPTIONS:+$PGOPTIONS }-c client_min_messages=warning"
passed=0 failed=0
ok()  { passed=$((passed + 1)); echo "ok   - $1"; }
bad() { failed=$((failed + 1)); echo "FAIL - $1"; [[ -z ${2:-} ]] || printf '%s\n' "$2" | sed 's/^/       /'; }

# q URL SQL: one value (unaligned, tuples only); errors are fatal for the check.
# (SQL on stdin: some statements here are larger than one argv string may be.)
q() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -f - <<<"$2"; }

# expect_value NAME URL SQL EXPECTED
expect_value() {
  local got
  if got=$(q "$2" "$3" 2>&1) && [[ $got == "$4" ]]; then
    ok "$1"
  else
    bad "$1" "expected: $4"$'\n'"got:      $got"
  fi
}

# expect_sqlstate NAME URL SQLSTATE SQL: SQL (run in one transaction that is
# rolled back) must fail with SQLSTATE.
expect_sqlstate() {
  local out
  if out=$(psql -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -d "$2" 2>&1 <<EOF
BEGIN;
$4
ROLLBACK;
EOF
  ); then
    bad "$1" "expected error $3, but the statements succeeded"
  elif grep -q "ERROR:  $3:" <<<"$out"; then
    ok "$1"
  else
    bad "$1" "expected error $3, got:"$'\n'"$out"
  fi
}

# expect_ok NAME URL SQL: SQL runs without error (in a rolled-back transaction).
expect_ok() {
  local out
  if out=$(psql -X -q -v ON_ERROR_STOP=1 -d "$2" 2>&1 <<EOF
BEGIN;
$3
ROLLBACK;
EOF
  ); then
    ok "$1"
  else
    bad "$1" "$out"
  fi
}

# Tables (and sequences) of every database ------------------------------------

check_tables() { # URL db-name relation...
  local url=$1 db=$2 rel missing=
  shift 2
  for rel in "$@"; do
    [[ $(q "$url" "SELECT to_regclass('public.$rel') IS NOT NULL") == t ]] || missing+=" $rel"
  done
  if [[ -z $missing ]]; then ok "$db: has $*"; else bad "$db: missing:$missing"; fi
}
check_tables "$TC_PG_URL" tc global_table branch_table lock_table node_table \
  global_history schema_version tc_id_seq
check_tables "$ORDERS_PG_URL" orders trade_order undo_log schema_version
check_tables "$STOCK_PG_URL" stock activity activity_ticket_bucket stock_log \
  undo_log consumed_event dead_letter schema_version
check_tables "$EVENTS_PG_URL" events points_ledger member_notice issued_ticket \
  member_hold consumed_event dead_letter schema_version

# schema_version must list exactly the files of the database's sets.
files_of() { # set...
  local set f
  for set in "$@"; do
    for f in "$root/sql/$set"/[0-9]*_*.sql; do echo "$set/${f##*/}"; done
  done | sort | paste -sd, -
}
listed_sql="SELECT string_agg(set_name || '/' || filename, ',' ORDER BY set_name || '/' || filename) FROM schema_version"
expect_value "tc: schema_version lists every file of sql/tc" "$TC_PG_URL" "$listed_sql" "$(files_of tc)"
expect_value "orders: schema_version lists every file of sql/rm, sql/orders" "$ORDERS_PG_URL" "$listed_sql" "$(files_of rm orders)"
expect_value "stock: schema_version lists every file of sql/rm, sql/stock, sql/consumer" "$STOCK_PG_URL" "$listed_sql" "$(files_of rm stock consumer)"
expect_value "events: schema_version lists every file of sql/consumer, sql/events" "$EVENTS_PG_URL" "$listed_sql" "$(files_of consumer events)"

# Every table and column documented (COMMENT ON) ------------------------------

undocumented_sql="
SELECT coalesce(string_agg(x, ' '), '') FROM (
  SELECT c.relname AS x FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = 'public' AND c.relkind = 'r' AND obj_description(c.oid, 'pg_class') IS NULL
  UNION ALL
  SELECT c.relname || '.' || a.attname FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
    AND col_description(c.oid, a.attnum) IS NULL) s"
for db in TC_PG_URL ORDERS_PG_URL STOCK_PG_URL EVENTS_PG_URL; do
  expect_value "${db%_PG_URL}: every table and column has a comment" "${!db}" "$undocumented_sql" ""
done

# Autovacuum settings of the queue tables --------------------------------------

reloption_sql() { # table
  echo "SELECT array_to_string(ARRAY(SELECT o FROM unnest(reloptions) o
          WHERE o ~ '^(fillfactor|autovacuum_vacuum_scale_factor|autovacuum_vacuum_threshold|autovacuum_vacuum_insert_scale_factor|autovacuum_vacuum_insert_threshold)=' ORDER BY o), ',')
        FROM pg_class WHERE oid = 'public.$1'::regclass"
}
want_opts="autovacuum_vacuum_insert_scale_factor=0,autovacuum_vacuum_insert_threshold=10000,autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=10000,fillfactor=80"
for t in global_table branch_table lock_table; do
  expect_value "tc: $t has the queue-table autovacuum settings" "$TC_PG_URL" "$(reloption_sql $t)" "$want_opts"
done
expect_value "orders: undo_log has the queue-table autovacuum settings" "$ORDERS_PG_URL" "$(reloption_sql undo_log)" "$want_opts"

# db-migrate is idempotent ------------------------------------------------------

counts() {
  echo "$(q "$TC_PG_URL" "SELECT count(*) FROM schema_version")" \
       "$(q "$ORDERS_PG_URL" "SELECT count(*) FROM schema_version")" \
       "$(q "$STOCK_PG_URL" "SELECT count(*) FROM schema_version")" \
       "$(q "$EVENTS_PG_URL" "SELECT count(*) FROM schema_version")"
}
before=$(counts)
if out=$("$migrate" "$TC_PG_URL" tc 2>&1 && "$migrate" "$ORDERS_PG_URL" rm orders 2>&1 &&
         "$migrate" "$STOCK_PG_URL" rm stock consumer 2>&1 &&
         "$migrate" "$EVENTS_PG_URL" consumer events 2>&1); then
  ok "db-migrate re-run exits 0"
else
  bad "db-migrate re-run exits 0" "$out"
fi
if grep -q "applying" <<<"$out"; then bad "db-migrate re-run applies nothing" "$out"
else ok "db-migrate re-run applies nothing"; fi
after=$(counts)
if [[ $before == "$after" ]]; then ok "schema_version row counts unchanged ($after)"
else bad "schema_version row counts unchanged" "before: $before"$'\n'"after:  $after"; fi

# Stock buckets: never oversold ------------------------------------------------

seed_activity="INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at)
  VALUES (900001, 'test', 1, 2, now(), now() + interval '1 hour');"
expect_ok "stock: a bucket with frozen + sold = stock is accepted" "$STOCK_PG_URL" "$seed_activity
  INSERT INTO activity_ticket_bucket VALUES (900001, 1, 0, 10, 4, 6);"
expect_sqlstate "stock: CHECK rejects frozen_count + sold_count > stock (insert)" "$STOCK_PG_URL" 23514 "$seed_activity
  INSERT INTO activity_ticket_bucket VALUES (900001, 1, 0, 10, 5, 6);"
expect_sqlstate "stock: CHECK rejects a freeze beyond stock (update)" "$STOCK_PG_URL" 23514 "$seed_activity
  INSERT INTO activity_ticket_bucket VALUES (900001, 1, 0, 10, 4, 6);
  UPDATE activity_ticket_bucket SET frozen_count = frozen_count + 1 WHERE activity_id = 900001;"
expect_sqlstate "stock: CHECK rejects a negative frozen_count" "$STOCK_PG_URL" 23514 "$seed_activity
  INSERT INTO activity_ticket_bucket VALUES (900001, 1, 0, 10, -1, 0);"
expect_sqlstate "stock: a bucket needs its activity (FK)" "$STOCK_PG_URL" 23503 \
  "INSERT INTO activity_ticket_bucket VALUES (900002, 1, 0, 10, 0, 0);"
expect_sqlstate "stock: stock_log rejects a second freeze of one order" "$STOCK_PG_URL" 23505 \
  "INSERT INTO stock_log (activity_id, ticket_type, bucket_id, order_id, op, qty) VALUES (1, 1, 0, 77, 'freeze', 1);
   INSERT INTO stock_log (activity_id, ticket_type, bucket_id, order_id, op, qty) VALUES (1, 1, 0, 77, 'freeze', 1);"
expect_sqlstate "stock: stock_log rejects an unknown op" "$STOCK_PG_URL" 23514 \
  "INSERT INTO stock_log (activity_id, ticket_type, bucket_id, order_id, op, qty) VALUES (1, 1, 0, 77, 'steal', 1);"

# stock_freeze_finish_many (sql/stock/008): the ends of many freezes leave
# what one stock_freeze_finish per order leaves.  Activities A and B the
# same: 8 orders of 1 or 2 tickets over 3 buckets; A's orders 1-7 finished
# one by one (1-4 paid, 5-6 cancelled, 7 expired, 8 left frozen), B's in one
# call after its order 4 was confirmed alone, with an unknown order too.
finish_twins="INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at)
  SELECT a, 'twin', 1, 10, now(), now() + interval '1 hour' FROM (VALUES (900011), (900012)) x(a);
  INSERT INTO activity_ticket_bucket SELECT a, 1, b, 10, 0, 0 FROM (VALUES (900011), (900012)) x(a), generate_series(0, 2) b;
  SELECT count(*) FROM (SELECT stock_freeze_apply(a * 10 + u, a, 1, u % 3, u, 1 + u % 2, now() + interval '1 hour')
    FROM (VALUES (900011), (900012)) x(a), generate_series(1, 8) u) y;"
expect_value "stock: stock_freeze_finish_many leaves what one finish per order leaves" "$STOCK_PG_URL" "BEGIN;
  $finish_twins
  SELECT count(*) FROM (SELECT stock_freeze_finish(9000110 + u, CASE WHEN u <= 4 THEN NULL WHEN u <= 6 THEN 'cancel' ELSE 'expire' END)
    FROM generate_series(1, 7) u) y;
  SELECT stock_freeze_finish(9000124, NULL);
  SELECT string_agg(result::text, ' ') FROM stock_freeze_finish_many('{9000121,9000122,9000123,9000124,9000125,9000126,9000127,9000999}',
    '{NULL,NULL,NULL,NULL,cancel,cancel,expire,NULL}');
  SELECT (SELECT array_agg((bucket_id, stock, frozen_count, sold_count) ORDER BY bucket_id) FROM activity_ticket_bucket WHERE activity_id = 900011)
       = (SELECT array_agg((bucket_id, stock, frozen_count, sold_count) ORDER BY bucket_id) FROM activity_ticket_bucket WHERE activity_id = 900012),
         (SELECT array_agg((order_id % 10, state, release_reason, finished_at IS NULL) ORDER BY order_id) FROM stock_freeze WHERE activity_id = 900011)
       = (SELECT array_agg((order_id % 10, state, release_reason, finished_at IS NULL) ORDER BY order_id) FROM stock_freeze WHERE activity_id = 900012),
         (SELECT array_agg((bucket_id, order_id % 10, op, qty) ORDER BY order_id, op) FROM stock_log WHERE activity_id = 900011)
       = (SELECT array_agg((bucket_id, order_id % 10, op, qty) ORDER BY order_id, op) FROM stock_log WHERE activity_id = 900012),
         (SELECT sum(sold_count) || '/' || sum(frozen_count) FROM activity_ticket_bucket WHERE activity_id = 900012);
  ROLLBACK;" "16
7
0
0 0 0 -6 0 0 0 -8
t|t|t|6/1"
expect_sqlstate "stock: stock_freeze_finish_many refuses an order given twice" "$STOCK_PG_URL" 22023 "$finish_twins
  SELECT * FROM stock_freeze_finish_many('{9000121,9000121}', '{NULL,NULL}');"
expect_sqlstate "stock: stock_freeze_finish_many refuses a reason short" "$STOCK_PG_URL" 22023 "$finish_twins
  SELECT * FROM stock_freeze_finish_many('{9000121,9000122}', '{NULL}');"

# Downstream consumers (events) ------------------------------------------------------

expect_sqlstate "events: points_ledger rejects a second credit of one order" "$EVENTS_PG_URL" 23505 \
  "INSERT INTO points_ledger (order_id, user_id, activity_id, points, event_id) VALUES (77, 1, 1, 100, 1);
   INSERT INTO points_ledger (order_id, user_id, activity_id, points, event_id) VALUES (77, 1, 1, 100, 2);"
expect_sqlstate "events: points_ledger rejects 0 points" "$EVENTS_PG_URL" 23514 \
  "INSERT INTO points_ledger (order_id, user_id, activity_id, points, event_id) VALUES (77, 1, 1, 0, 1);"
expect_sqlstate "events: member_notice rejects a second notice of one order" "$EVENTS_PG_URL" 23505 \
  "INSERT INTO member_notice (order_id, user_id, activity_id, kind, text, event_id) VALUES (77, 1, 1, 'paid', 'a', 1);
   INSERT INTO member_notice (order_id, user_id, activity_id, kind, text, event_id) VALUES (77, 1, 1, 'paid', 'b', 1);"
expect_sqlstate "events: member_notice rejects an unknown kind" "$EVENTS_PG_URL" 23514 \
  "INSERT INTO member_notice (order_id, user_id, activity_id, kind, text, event_id) VALUES (77, 1, 1, 'spam', 'a', 1);"
expect_sqlstate "events: issued_ticket rejects a second ticket with one (order, seq)" "$EVENTS_PG_URL" 23505 \
  "INSERT INTO issued_ticket (order_id, seq, ticket_code, user_id, activity_id, ticket_type, event_id) VALUES (77, 1, 'a', 1, 1, 1, 1);
   INSERT INTO issued_ticket (order_id, seq, ticket_code, user_id, activity_id, ticket_type, event_id) VALUES (77, 1, 'b', 1, 1, 1, 1);"
expect_sqlstate "events: issued_ticket rejects a ticket code used twice" "$EVENTS_PG_URL" 23505 \
  "INSERT INTO issued_ticket (order_id, seq, ticket_code, user_id, activity_id, ticket_type, event_id) VALUES (77, 1, 'a', 1, 1, 1, 1);
   INSERT INTO issued_ticket (order_id, seq, ticket_code, user_id, activity_id, ticket_type, event_id) VALUES (77, 2, 'a', 1, 1, 1, 1);"
expect_sqlstate "events: issued_ticket rejects seq 0" "$EVENTS_PG_URL" 23514 \
  "INSERT INTO issued_ticket (order_id, seq, ticket_code, user_id, activity_id, ticket_type, event_id) VALUES (77, 0, 'a', 1, 1, 1, 1);"
expect_sqlstate "events: consumed_event rejects a second row of one (group, biz_key)" "$EVENTS_PG_URL" 23505 \
  "INSERT INTO consumed_event (consumer_group, biz_key, event_id) VALUES ('points', 'order.paid:77', 1);
   INSERT INTO consumed_event (consumer_group, biz_key, event_id) VALUES ('points', 'order.paid:77', 2);"
expect_sqlstate "events: dead_letter rejects an unknown state" "$EVENTS_PG_URL" 23514 \
  "INSERT INTO dead_letter (consumer_group, biz_key, event_id, stream_id, event, deliveries, reason, state)
   VALUES ('notify', 'order.paid:77', 1, '1-0', '{}', 3, 'x', 'LOST');"

# Orders ---------------------------------------------------------------------------

expect_ok "orders: an UNPAID order is accepted" "$ORDERS_PG_URL" \
  "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, xid)
   VALUES (1, 1, 1, 42, 2, 0, 'x:1');"
expect_sqlstate "orders: CHECK rejects qty 0" "$ORDERS_PG_URL" 23514 \
  "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id) VALUES (1, 1, 1, 42, 0, 0);"
expect_sqlstate "orders: CHECK rejects an unknown status" "$ORDERS_PG_URL" 23514 \
  "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, status) VALUES (1, 1, 1, 42, 1, 0, 'SHIPPED');"
expect_sqlstate "orders: UNIQUE (user_id, idem_key) rejects a second order of one key" "$ORDERS_PG_URL" 23505 \
  "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, idem_key) VALUES (1, 1, 1, 42, 1, 0, 'k-1');
   INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, idem_key) VALUES (2, 1, 1, 42, 1, 0, 'k-1');"
expect_ok "orders: one key for two users, and orders without a key, do not conflict" "$ORDERS_PG_URL" \
  "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, idem_key) VALUES (1, 1, 1, 42, 1, 0, 'k-1');
   INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, idem_key) VALUES (2, 1, 1, 43, 1, 0, 'k-1');
   INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id) VALUES (3, 1, 1, 42, 1, 0);
   INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id) VALUES (4, 1, 1, 42, 1, 0);"
expect_sqlstate "orders: CHECK rejects a malformed idempotency key" "$ORDERS_PG_URL" 23514 \
  "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, idem_key) VALUES (1, 1, 1, 42, 1, 0, 'a b');"
expect_value "orders: order_local_insert answers -9 for a key held by another order" "$ORDERS_PG_URL" \
  "BEGIN;
   SELECT order_local_insert(1, 1, 1, 42, 1, 0, NULL, NULL, 'k-1') \\g /dev/null
   SELECT order_local_insert(2, 1, 1, 42, 1, 0, NULL, NULL, 'k-1')
          || ',' || order_local_insert(1, 1, 1, 42, 1, 0, NULL, NULL, 'k-1')
          || ',' || order_local_insert(3, 1, 1, 42, 1, 0, NULL, NULL);
   SELECT count(*) FROM trade_order WHERE user_id = 42;
   ROLLBACK;" $'-9,1,0\n2'

# Undo log --------------------------------------------------------------------------

undo_row="INSERT INTO undo_log (branch_id, xid, context, rollback_info) VALUES (7, 'x:1', 'serializer=json', '{\"before\": [], \"after\": []}');"
for db in ORDERS_PG_URL STOCK_PG_URL; do
  expect_sqlstate "${db%_PG_URL}: undo_log UNIQUE (xid, branch_id) rejects a duplicate" "${!db}" 23505 "$undo_row
    $undo_row"
done
expect_sqlstate "orders: a late local commit fails on the global-finished guard row" "$ORDERS_PG_URL" 23505 \
  "INSERT INTO undo_log (branch_id, xid, log_status) VALUES (7, 'x:1', 1);
   $undo_row"
# sql/rm/004_undo_text.sql: the undo is text; a library of before it
# writes "$4::jsonb", kept as its text.
expect_value "orders: an undo row written as a library before version 4 writes it (::jsonb) is kept, as text" "$ORDERS_PG_URL" \
  "BEGIN;
   INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status)
   VALUES ('j:1', 1, 'serializer=json', '[[\"i\",\"t\"]]'::jsonb, 0);
   SELECT pg_typeof(rollback_info) || ' ' || rollback_info FROM undo_log WHERE xid = 'j:1';
   ROLLBACK;" 'text [["i", "t"]]'
expect_sqlstate "orders: a normal undo row needs rollback_info" "$ORDERS_PG_URL" 23514 \
  "INSERT INTO undo_log (branch_id, xid) VALUES (7, 'x:1');"

# TC store ---------------------------------------------------------------------------

lock_row() { # row_key xid branch_id
  echo "INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk)
        VALUES ('$1', '$2', 1, $3, 'orders', 'trade_order', '1');"
}
expect_sqlstate "tc: lock_table PK rejects a second holder of a row_key" "$TC_PG_URL" 23505 \
  "$(lock_row 'orders^^^trade_order^^^1' 'x:1' 11)
   $(lock_row 'orders^^^trade_order^^^1' 'x:2' 21)"
expect_value "tc: INSERT ... ON CONFLICT DO NOTHING reports the conflict (0 rows)" "$TC_PG_URL" \
  "BEGIN; $(lock_row 'k^^^t^^^1' 'x:1' 11)
   WITH i AS (INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk)
              VALUES ('k^^^t^^^1', 'x:2', 2, 21, 'k', 't', '1') ON CONFLICT (row_key) DO NOTHING RETURNING 1)
   SELECT count(*) FROM i; ROLLBACK;" "0"

long_key="orders^^^trade_order^^^$(printf 'k%.0s' {1..977})"
if [[ ${#long_key} -ne 1000 ]]; then bad "test setup: 1000-character key" "length ${#long_key}"; fi
# Random-looking (hardly compressible) lock keys for lock_keys and row_key.
long_rand=$(q "$TC_PG_URL" "SELECT string_agg(md5(i::text), '') FROM generate_series(1, 2048) i")
expect_value "tc: a 1000-character lock key is stored unchanged" "$TC_PG_URL" \
  "BEGIN; $(lock_row "$long_key" 'x:1' 11)
   SELECT length(row_key) || ' ' || (row_key = '$long_key') FROM lock_table WHERE row_key = '$long_key'; ROLLBACK;" \
  "1000 true"
expect_value "tc: a 2048-byte incompressible row_key is stored unchanged" "$TC_PG_URL" \
  "BEGIN; $(lock_row "${long_rand:0:2048}" 'x:1' 11)
   SELECT octet_length(row_key) || ' ' || (row_key = '${long_rand:0:2048}') FROM lock_table WHERE xid = 'x:1'; ROLLBACK;" \
  "2048 true"
expect_sqlstate "tc: a row_key over 2048 bytes is rejected, not truncated" "$TC_PG_URL" 23514 \
  "$(lock_row "${long_rand:0:2049}" 'x:1' 11)"
expect_value "tc: branch_table.lock_keys keeps 64 KiB unchanged" "$TC_PG_URL" \
  "BEGIN;
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, lock_keys)
   VALUES (5, 'x:1', 1, 'orders', 1, '${long_rand:0:65536}');
   SELECT octet_length(lock_keys) || ' ' || (lock_keys = '${long_rand:0:65536}') FROM branch_table WHERE branch_id = 5;
   ROLLBACK;" "65536 true"
expect_sqlstate "tc: global_table rejects an xid over 128 bytes" "$TC_PG_URL" 23514 \
  "INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id)
   VALUES (repeat('x', 129), 1, 1, 1000, now(), 1);"
expect_sqlstate "tc: global_table idem_key is unique per application" "$TC_PG_URL" 23505 \
  "INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id, idem_key, application_id) VALUES ('a:1', 1, 1, 1000, now(), 1, 'k', 'app');
   INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id, idem_key, application_id) VALUES ('a:2', 2, 1, 1000, now(), 1, 'k', 'app');"
expect_ok "tc: two applications may use one idem_key" "$TC_PG_URL" \
  "INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id, idem_key, application_id) VALUES ('a:1', 1, 1, 1000, now(), 1, 'k', 'app-a');
   INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id, idem_key, application_id) VALUES ('a:2', 2, 1, 1000, now(), 1, 'k', 'app-b');"
expect_ok "tc: global_table accepts many begins without idem_key" "$TC_PG_URL" \
  "INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id) VALUES ('a:1', 1, 1, 1000, now(), 1);
   INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id) VALUES ('a:2', 2, 1, 1000, now(), 1);"
expect_sqlstate "tc: branch_table (xid, idem_key) is unique" "$TC_PG_URL" 23505 \
  "INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, idem_key) VALUES (1, 'a:1', 1, 'r', 1, 'k');
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, idem_key) VALUES (2, 'a:1', 1, 'r', 1, 'k');"
expect_value "tc: tc_id_seq hands out distinct ids" "$TC_PG_URL" \
  "SELECT count(DISTINCT v) FROM (SELECT nextval('tc_id_seq') v FROM generate_series(1, 5000)) s" "5000"

# Stale phase-two outcomes (sql/tc/011_stale_outcomes.sql, model/saga.pml):
# a saga 'g' with steps 1 and 2 and a TCC branch 3 in status G, branches
# at S1 S2 S3; one outcome ST of branch B recorded; the answer, then the
# global's status and the branches' ("gone" once finished).
phase2_after() { # G S1 S2 S3 B ST
  echo "BEGIN;
   INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id, next_retry_at)
   VALUES ('g:1', 1, $1, 1000, now(), 1, now() + interval '1 hour');
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, branch_type, status)
   VALUES (1, 'g:1', 1, 'trip', 2, $2), (2, 'g:1', 1, 'trip', 2, $3), (3, 'g:1', 1, 'wallet', 1, $4);
   SELECT result || ' ' || global_status FROM tc_phase2_batch(ARRAY['g:1'], ARRAY[$5::bigint], ARRAY[$6::smallint],
     ARRAY['e'], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text], 50, 300);
   SELECT coalesce((SELECT status || ' ' || (SELECT string_agg(b.status::text, ',' ORDER BY b.branch_id)
                                              FROM branch_table b WHERE b.xid = 'g:1')
                      FROM global_table WHERE xid = 'g:1'), 'gone');
   ROLLBACK;"
}
expect_value "tc: a commit drive's refused action after the saga turned is not a failed rollback" "$TC_PG_URL" \
  "$(phase2_after 4 5 8 8 2 7)" $'ok 4\n4 5,8,8'
expect_value "tc: a stale 'failed for good' of a step that went in does not turn the saga" "$TC_PG_URL" \
  "$(phase2_after 8 5 5 1 2 7)" $'ok 8\n8 5,5,1'
expect_value "tc: a timed-out call of a branch that finished does not make the global retry" "$TC_PG_URL" \
  "$(phase2_after 5 8 8 1 1 9)" $'ok 5\n5 8,8,1'
expect_value "tc: the last outcome recorded again finishes the rollback" "$TC_PG_URL" \
  "$(phase2_after 5 8 8 8 2 8)" $'ok 11\ngone'
expect_value "tc: an action failed for good turns the saga to its compensations" "$TC_PG_URL" \
  "$(phase2_after 8 5 1 1 2 7)" $'compensate 4\n4 5,7,1'

# Begins and finishes without ON CONFLICT where none can come
# (sql/tc/013_plain_inserts.sql).  A begin batch: two without a key, one
# with a key, one repeating that key (answered the first xid).
expect_value "tc: a begin batch inserts keyless and keyed begins, a repeated key gets the first xid" "$TC_PG_URL" \
  "BEGIN;
   SELECT string_agg(item || ' ' || xid || ' ' || result, ',' ORDER BY item)
     FROM tc_begin_batch(ARRAY['b:1', 'b:2', 'b:3', 'b:4'], ARRAY[1, 2, 3, 4]::bigint[], ARRAY[1000, 1000, 1000, 1000],
                         ARRAY['n', 'n', 'n', 'n'], ARRAY['app', 'app', 'app', 'app'], ARRAY['grp', 'grp', 'grp', 'grp'],
                         ARRAY[NULL, NULL, 'k1', 'k1'], 1);
   SELECT count(*) || ' ' || count(idem_key) FROM global_table WHERE xid LIKE 'b:%';
   ROLLBACK;" $'1 b:1 ok,2 b:2 ok,3 b:3 ok,4 b:3 ok\n3 1'
# A finish writes the history row once, from the global it deletes, with
# the branches it deletes; an xid listed twice keeps its first status; a
# finish of a global already finished writes nothing and fails nothing.
expect_value "tc: a finish writes one history row with its branches; a second finish writes none" "$TC_PG_URL" \
  "BEGIN;
   INSERT INTO global_table (xid, transaction_id, status, timeout_ms, deadline, node_id, application_id)
   VALUES ('f:1', 1, 2, 1000, now(), 1, 'app');
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status)
   VALUES (11, 'f:1', 1, 'orders', 1), (12, 'f:1', 1, 'stock', 1);
   SELECT tc__finish_many(ARRAY['f:1', 'f:1'], ARRAY[9, 11]::smallint[], 5::smallint);
   SELECT tc__finish_many(ARRAY['f:1'], ARRAY[11]::smallint[]);
   SELECT count(*) || ' ' || min(status) || ' ' || min(application_id) || ' '
          || min(branches::text) FROM global_history WHERE xid = 'f:1';
   SELECT (SELECT count(*) FROM global_table WHERE xid = 'f:1') + (SELECT count(*) FROM branch_table WHERE xid = 'f:1');
   ROLLBACK;" \
  $'\n\n1 9 app [[11, "orders", 0, 5], [12, "stock", 0, 5]]\n0'
# History rows hold one short array per branch since version 15; the
# readers' functions take that form and the objects of older rows alike
# (sql/tc/015_compact_history.sql).
expect_value "tc: tc_history_branches gives objects from either form; tc_history_has_branch finds ids in both" "$TC_PG_URL" \
  "SELECT tc_history_branches('[[11, \"orders\", 0, 5], [12, \"stock\", 1, 8]]')::text;
   SELECT tc_history_branches('[{\"status\": 5, \"branch_id\": 11, \"branch_type\": 0, \"resource_id\": \"orders\"}]')::text;
   SELECT tc_history_branches('[]')::text || ' ' || tc_history_branches('null')::text;
   SELECT tc_history_has_branch('[[11, \"orders\", 0, 5]]', 11) || ' ' || tc_history_has_branch('[[11, \"orders\", 0, 5]]', 5)
          || ' ' || tc_history_has_branch('[{\"branch_id\": 12, \"status\": 5}]', 12)
          || ' ' || tc_history_has_branch('[{\"branch_id\": 12, \"status\": 5}]', 5)
          || ' ' || tc_history_has_branch('{}', 12);" \
  $'[{"status": 5, "branch_id": 11, "branch_type": 0, "resource_id": "orders"}, {"status": 8, "branch_id": 12, "branch_type": 1, "resource_id": "stock"}]\n[{"status": 5, "branch_id": 11, "branch_type": 0, "resource_id": "orders"}]\n[] []\ntrue false true false false'

# A branch costs one index entry; a registration that begins its global
# does not lock it (sql/tc/014_lean_branches.sql).
expect_sqlstate "tc: a branch id repeated within its xid is refused (a register run twice meets 23505)" "$TC_PG_URL" 23505 \
  "INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status) VALUES (7, 'a:1', 1, 'r', 1);
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status) VALUES (7, 'a:1', 1, 's', 1);"
expect_ok "tc: branches without an idempotency key need no key index entry of their own" "$TC_PG_URL" \
  "INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status) VALUES (1, 'a:1', 1, 'r', 1);
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status) VALUES (2, 'a:1', 1, 'r', 1);"
expect_value "tc: branch_table's indexes: its key (xid, branch_id), and partial ones for retries and idempotency keys" "$TC_PG_URL" \
  "SELECT string_agg(indexrelid::regclass || ' ' || (indpred IS NOT NULL), ',' ORDER BY indexrelid::regclass::text)
     FROM pg_index WHERE indrelid = 'branch_table'::regclass" \
  "branch_table_idem_hash_key true,branch_table_next_retry_idx true,branch_table_pkey false"
# The idempotency keys' index, a hash of (xid, idem_key) since
# sql/tc/017_store_key_lookups.sql: one key twice in an xid is refused, the
# same key in another xid is not.
expect_sqlstate "tc: an idempotency key repeated within its xid is refused" "$TC_PG_URL" 23505 \
  "INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, idem_key) VALUES (1, 'k:1', 1, 'r', 1, 'key');
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, idem_key) VALUES (2, 'k:1', 1, 'r', 1, 'key');"
expect_ok "tc: one idempotency key in two xids, and two keys in one xid, are admitted" "$TC_PG_URL" \
  "INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, idem_key) VALUES (1, 'k:1', 1, 'r', 1, 'key');
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, idem_key) VALUES (2, 'k:2', 2, 'r', 1, 'key');
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, idem_key) VALUES (3, 'k:1', 1, 'r', 1, 'key2');"
# register_in XID BRANCH: one AT branch without keys, its result.
register_in() {
  echo "SELECT string_agg(result, ',') FROM tc_register_batch(ARRAY['$1'], ARRAY[$2]::bigint[], ARRAY['orders'],
          ARRAY[0]::smallint[], ARRAY[NULL], ARRAY[NULL], ARRAY['c'], ARRAY[NULL], ARRAY['app'], ARRAY['grp'],
          '{}', '{}', '{}', '{}');"
}
expect_value "tc: a registration that began its global leaves it unlocked; one in an older global share-locks it" \
  "$TC_PG_URL" \
  "BEGIN;
   SAVEPOINT older;
   SELECT count(*) FROM tc_begin_batch(ARRAY['l:1'], ARRAY[1]::bigint[], ARRAY[60000], ARRAY['n'], ARRAY['app'],
                                       ARRAY['grp'], ARRAY[NULL], 1);
   RELEASE SAVEPOINT older;
   SELECT count(*) FROM tc_begin_batch(ARRAY['l:2'], ARRAY[2]::bigint[], ARRAY[60000], ARRAY['n'], ARRAY['app'],
                                       ARRAY['grp'], ARRAY[NULL], 1);
   $(register_in l:1 101)
   $(register_in l:2 102)
   SELECT string_agg(xid || ' ' || (xmax::text <> '0'), ',' ORDER BY xid) FROM global_table WHERE xid LIKE 'l:%';
   SELECT count(*) FROM branch_table WHERE xid LIKE 'l:%';
   ROLLBACK;" $'1\n1\nok\nok\nl:1 true,l:2 false\n2'

# A decision's ownership (sql/tc/008's rule, 016's inline cases): the
# application that began it; another application of its group that holds a
# branch; not one without a branch, nor another group; the coordinator
# itself (no group) always.
expect_value "tc: a decision is the beginner's, a branch holder's of its group, or the coordinator's" "$TC_PG_URL" \
  "BEGIN;
   SELECT count(*) FROM tc_begin_batch(ARRAY['o:1', 'o:2', 'o:3', 'o:4', 'o:5'], ARRAY[1, 2, 3, 4, 5]::bigint[],
                                       ARRAY[60000, 60000, 60000, 60000, 60000], ARRAY['n', 'n', 'n', 'n', 'n'],
                                       ARRAY['tm', 'tm', 'tm', 'tm', 'tm'], ARRAY['grp', 'grp', 'grp', 'grp', 'grp'],
                                       ARRAY[NULL, NULL, NULL, NULL, NULL]::text[], 1);
   INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status, application_id, app_group)
   VALUES (21, 'o:2', 2, 'stock', 1, 'rm', 'grp');
   SELECT string_agg(item || ' ' || result || ' ' || status, ',' ORDER BY item)
     FROM tc_decide_batch(ARRAY['o:1', 'o:2', 'o:3', 'o:4', 'o:5'], array_fill('rollback'::text, ARRAY[5]),
                          ARRAY['tm', 'rm', 'rm', 'tm', NULL], ARRAY['grp', 'grp', 'grp', 'other', NULL], 30000);
   ROLLBACK;" $'5\n1 ok 11,2 ok 4,3 not_owner 0,4 not_owner 0,5 ok 11'

# expect_by_key NAME SQL EXPECTED: on the queue tables and the history
# vacuumed empty (when a plan made then would scan them), SQL answers
# EXPECTED and scans none of them sequentially: the store's functions read
# them by their keys (sql/tc/017_store_key_lookups.sql).  The scans are
# counted by pg_stat (each q is a session of its own, whose counts are
# flushed when it ends); a check's own reads run with enable_seqscan off.
expect_by_key() {
  local scans="SELECT sum(seq_scan) FROM pg_stat_user_tables
                WHERE relname IN ('global_table', 'branch_table', 'lock_table', 'global_history')" before
  q "$TC_PG_URL" "VACUUM global_table, branch_table, lock_table, global_history" >/dev/null
  before=$(q "$TC_PG_URL" "$scans")
  expect_value "$1" "$TC_PG_URL" "$2" "$3"
  expect_value "$1: by key only, vacuumed empty as the tables were" "$TC_PG_URL" "$scans" "$before"
}

# A registration looks repeated idempotency keys up by key.  Two keyed
# registrations in one global: the second repeats the first's key and gets
# its branch id.
expect_by_key "tc: a repeated idempotency key of a registration gets the first branch id" \
  "BEGIN;
   SELECT count(*) FROM tc_begin_batch(ARRAY['r:1'], ARRAY[1]::bigint[], ARRAY[60000], ARRAY['n'], ARRAY['app'],
                                       ARRAY['grp'], ARRAY[NULL]::text[], 1);
   SELECT string_agg(item || ' ' || result || ' ' || branch_id, ',' ORDER BY item)
     FROM tc_register_batch(ARRAY['r:1'], ARRAY[31]::bigint[], ARRAY['orders'], ARRAY[0]::smallint[],
                            ARRAY[NULL], ARRAY[NULL], ARRAY['c'], ARRAY['key1'], ARRAY['app'], ARRAY['grp'],
                            '{}', '{}', '{}', '{}');
   SELECT string_agg(item || ' ' || result || ' ' || branch_id, ',' ORDER BY item)
     FROM tc_register_batch(ARRAY['r:1', 'r:1'], ARRAY[32, 33]::bigint[], ARRAY['stock', 'stock'],
                            ARRAY[0, 0]::smallint[], ARRAY[NULL, NULL], ARRAY[NULL, NULL], ARRAY['c', 'c'],
                            ARRAY['key1', 'key2'], ARRAY['app', 'app'], ARRAY['grp', 'grp'], '{}', '{}', '{}', '{}');
   SET LOCAL enable_seqscan = off; -- this check's own read, not counted below
   SELECT string_agg(branch_id::text, ',' ORDER BY branch_id) FROM branch_table WHERE xid = 'r:1';
   ROLLBACK;" $'1\n1 ok 31\n1 ok 31,2 ok 33\n31,33'

# A registration's answers per item: a global that does not exist, one of
# its group (the branch row carries the global's transaction id, kept from
# the first look at the globals, sql/tc/017), one of another group.
expect_value "tc: a register batch answers not_found, ok and not_owner per item, and carries the transaction id" \
  "$TC_PG_URL" \
  "BEGIN;
   SELECT count(*) FROM tc_begin_batch(ARRAY['m:1'], ARRAY[7]::bigint[], ARRAY[60000], ARRAY['n'], ARRAY['app'],
                                       ARRAY['grp'], ARRAY[NULL]::text[], 1);
   SELECT string_agg(item || ' ' || result || ' ' || coalesce(branch_id::text, '-'), ',' ORDER BY item)
     FROM tc_register_batch(ARRAY['nope:1', 'm:1', 'm:1'], ARRAY[51, 52, 53]::bigint[], ARRAY['r', 'r', 'r'],
                            ARRAY[0, 0, 0]::smallint[], ARRAY[NULL, NULL, NULL], ARRAY[NULL, NULL, NULL],
                            ARRAY['c', 'c', 'c'], ARRAY[NULL, NULL, NULL], ARRAY['app', 'app', 'x'],
                            ARRAY['grp', 'grp', 'other'], '{}', '{}', '{}', '{}');
   SET LOCAL enable_seqscan = off;
   SELECT string_agg(branch_id || ' ' || transaction_id, ',') FROM branch_table WHERE xid = 'm:1';
   ROLLBACK;" $'1\n1 not_found -,2 ok 52,3 not_owner -\n52 7'
# A whole transaction's store functions: begins, registrations (one with a
# lock key), the decision's lock and the decisions (a commit finished at
# once, a rollback), and the rollback's phase-two reports that finish it.
expect_by_key "tc: a transaction's store functions answer as usual on vacuumed-empty tables" \
  "BEGIN;
   SELECT count(*) FROM tc_begin_batch(ARRAY['s:1', 's:2'], ARRAY[1, 2]::bigint[], ARRAY[60000, 60000],
                                       ARRAY['n', 'n'], ARRAY['app', 'app'], ARRAY['grp', 'grp'],
                                       ARRAY[NULL, NULL]::text[], 1);
   SELECT string_agg(result, ',' ORDER BY item)
     FROM tc_register_batch(ARRAY['s:1', 's:1', 's:2', 's:2'], ARRAY[41, 42, 43, 44]::bigint[],
                            ARRAY['orders', 'stock', 'orders', 'stock'], ARRAY[0, 0, 0, 0]::smallint[],
                            ARRAY[NULL, NULL, NULL, 'stock:t:1'], ARRAY[NULL, NULL, NULL, NULL],
                            ARRAY['c', 'c', 'c', 'c'], ARRAY['k1', 'k2', 'k3', 'k4'],
                            ARRAY['app', 'app', 'app', 'app'], ARRAY['grp', 'grp', 'grp', 'grp'],
                            ARRAY[4], ARRAY['stock^^^t^^^1'], ARRAY['t'], ARRAY['1']);
   SELECT count(*) FROM tc_decide_lock(ARRAY['s:1', 's:2']);
   SELECT string_agg(item || ' ' || result || ' ' || status, ',' ORDER BY item)
     FROM tc_decide_batch(ARRAY['s:1', 's:2'], ARRAY['commit', 'rollback'], ARRAY['app', 'app'],
                          ARRAY['grp', 'grp'], 30000);
   SELECT string_agg(result || ' ' || global_status || ' ' || finished, ',' ORDER BY item)
     FROM tc_phase2_batch(ARRAY['s:2', 's:2'], ARRAY[43, 44]::bigint[], ARRAY[8, 8]::smallint[],
                          ARRAY[NULL, NULL], ARRAY[NULL, NULL], ARRAY[NULL, NULL], ARRAY[NULL, NULL], 50, 300);
   ROLLBACK;" $'2\nok,ok,ok,ok\n4\n1 ok 9,2 ok 4\nok 11 true,ok 11 true'

# The batch functions tcd calls keep their own planner settings: by key
# (017) and one generic plan per statement (018).  A later CREATE OR
# REPLACE FUNCTION without its SET clauses would drop them silently: the
# checks above would still pass, on plans made again at every call.
expect_value "tc: the batch functions tcd calls plan by key, once per session" "$TC_PG_URL" \
  "SELECT string_agg(p.proname || ' ' || array_to_string(ARRAY(SELECT c FROM unnest(p.proconfig) c ORDER BY c), ' '),
                     ',' ORDER BY p.proname)
     FROM pg_proc p
    WHERE p.proname IN ('tc_begin_batch', 'tc_register_batch', 'tc_decide_lock', 'tc_decide_batch',
                        'tc_phase2_batch')" \
  "tc_begin_batch enable_seqscan=off plan_cache_mode=force_generic_plan,tc_decide_batch enable_seqscan=off plan_cache_mode=force_generic_plan,tc_decide_lock enable_seqscan=off plan_cache_mode=force_generic_plan,tc_phase2_batch enable_seqscan=off plan_cache_mode=force_generic_plan,tc_register_batch enable_seqscan=off plan_cache_mode=force_generic_plan"

# db-migrate itself, on a scratch database --------------------------------------

admin_url=${TC_PG_URL%/*}/postgres
scratch=schema_test_scratch
scratch_url=${TC_PG_URL%/*}/$scratch
q "$admin_url" "DROP DATABASE IF EXISTS $scratch" >/dev/null
q "$admin_url" "CREATE DATABASE $scratch" >/dev/null
sqldir=$(mktemp -d)
trap 'rm -rf "$sqldir"; q "$admin_url" "DROP DATABASE IF EXISTS $scratch" >/dev/null 2>&1 || true' EXIT

# Concurrent first runs of every set: each file applied exactly once.
pids=()
for i in 1 2 3 4; do
  "$migrate" -q "$scratch_url" tc rm orders stock consumer events >"$sqldir/par$i.log" 2>&1 & pids+=($!)
done
par_ok=1
for p in "${pids[@]}"; do wait "$p" || par_ok=0; done
if [[ $par_ok -eq 1 ]]; then ok "4 concurrent db-migrate runs all succeed"
else bad "4 concurrent db-migrate runs all succeed" "$(cat "$sqldir"/par*.log)"; fi
nfiles=$(files_of tc rm orders stock consumer events | tr ',' '\n' | wc -l)
expect_value "concurrent runs applied each file once" "$scratch_url" \
  "SELECT count(*) || ' ' || count(DISTINCT (set_name, version)) FROM schema_version" "$nfiles $nfiles"

# Ordering (numeric, not lexical) and atomicity, with a private sql/ tree.
mkdir -p "$sqldir/sql/demo"
echo "CREATE TABLE demo_a (x int);"                    >"$sqldir/sql/demo/2_a.sql"
echo "ALTER TABLE demo_a ADD COLUMN y int;"            >"$sqldir/sql/demo/10_b.sql"
echo "CREATE TABLE demo_c (x int); SELECT 1/0;"        >"$sqldir/sql/demo/11_c.sql"
if out=$(TX_SQL_DIR=$sqldir/sql "$migrate" "$scratch_url" demo 2>&1); then
  bad "a failing file makes db-migrate fail" "$out"
else
  ok "a failing file makes db-migrate fail"
  if grep -q "11_c.sql" <<<"$out" && grep -q "division by zero" <<<"$out"; then
    ok "the error names the file and the cause"
  else
    bad "the error names the file and the cause" "$out"
  fi
fi
expect_value "files applied in numeric order (2 before 10), failed file rolled back" "$scratch_url" \
  "SELECT (SELECT string_agg(version::text, ',' ORDER BY applied_at, version) FROM schema_version WHERE set_name = 'demo')
          || ' ' || (to_regclass('demo_c') IS NULL)" "2,10 true"
echo "CREATE TABLE demo_c (x int);" >"$sqldir/sql/demo/11_c.sql"
if out=$(TX_SQL_DIR=$sqldir/sql "$migrate" "$scratch_url" demo 2>&1) && grep -q "applying demo/11_c.sql" <<<"$out" &&
   ! grep -q "applying demo/2_a.sql" <<<"$out"; then
  ok "after the fix only the pending file is applied"
else
  bad "after the fix only the pending file is applied" "$out"
fi
echo "-- edited" >>"$sqldir/sql/demo/2_a.sql"
if out=$(TX_SQL_DIR=$sqldir/sql "$migrate" "$scratch_url" demo 2>&1) && grep -q "warning: demo/2_a.sql changed" <<<"$out"; then
  ok "an edited applied file is reported, not re-applied"
else
  bad "an edited applied file is reported, not re-applied" "$out"
fi

# A file must not end the transaction db-migrate runs it in.
mkdir -p "$sqldir/sql/txctl" "$sqldir/sql/txctl2"
printf 'CREATE TABLE demo_e (x int);\nCOMMIT;\n' >"$sqldir/sql/txctl/001_e.sql"
printf 'CREATE TABLE demo_f (x int);\n  COMMIT;\n' >"$sqldir/sql/txctl2/001_f.sql"
if out=$(TX_SQL_DIR=$sqldir/sql "$migrate" "$scratch_url" txctl 2>&1); then
  bad "a top-level COMMIT in a file is refused before anything runs" "$out"
elif grep -q "contains BEGIN/COMMIT" <<<"$out" &&
     [[ $(q "$scratch_url" "SELECT to_regclass('demo_e') IS NULL") == t ]]; then
  ok "a top-level COMMIT in a file is refused before anything runs"
else
  bad "a top-level COMMIT in a file is refused before anything runs" "$out"
fi
if out=$(TX_SQL_DIR=$sqldir/sql "$migrate" "$scratch_url" txctl2 2>&1); then
  bad "a file that commits by itself is reported and not recorded" "$out"
elif grep -q "ended the transaction itself" <<<"$out" &&
     [[ $(q "$scratch_url" "SELECT count(*) FROM schema_version WHERE set_name = 'txctl2'") == 0 ]]; then
  ok "a file that commits by itself is reported and not recorded"
else
  bad "a file that commits by itself is reported and not recorded" "$out"
fi

# Clear errors for bad input.
expect_fail() { # name expected-exit-code grep-pattern cmd...
  local name=$1 want=$2 pat=$3 out rc=0
  shift 3
  out=$("$@" 2>&1) || rc=$?
  if [[ $rc -eq $want ]] && grep -q -- "$pat" <<<"$out"; then ok "$name"
  else bad "$name" "exit $rc (want $want), output:"$'\n'"$out"; fi
}
expect_fail "db-migrate: unknown set is a clear error" 1 "unknown schema set 'nosuch'" \
  "$migrate" "$scratch_url" nosuch
expect_fail "db-migrate: missing SET is a usage error" 2 "usage:" "$migrate" "$scratch_url"
expect_fail "db-migrate: unreachable server is a clear error" 1 "cannot prepare schema_version" \
  "$migrate" "postgresql://postgres@127.0.0.1:1/none" tc
mkdir -p "$sqldir/sql/badname"
echo "SELECT 1;" >"$sqldir/sql/badname/first.sql"
expect_fail "db-migrate: a misnamed file is a clear error" 1 "must be named NNN_description.sql" \
  env TX_SQL_DIR="$sqldir/sql" "$migrate" "$scratch_url" badname
if "$migrate" --help | grep -q "Usage:"; then ok "db-migrate --help"; else bad "db-migrate --help"; fi

# Each set's schema.sql is what its migrations make (scripts/schema-dump):
# the file a reader trusts for the live definitions must not drift.
for d in "$root"/sql/*/; do
  set=$(basename "$d")
  if [[ ! -f $d/schema.sql ]]; then
    bad "sql/$set/schema.sql exists" "generate it: scripts/schema-dump --write \$TC_PG_URL"
    continue
  fi
  if out=$("$root/scripts/schema-dump" "$TC_PG_URL" "$set" 2>&1) && diff -u "$d/schema.sql" - <<<"$out" >/dev/null; then
    ok "sql/$set/schema.sql is what the migrations make"
  else
    bad "sql/$set/schema.sql is what the migrations make" \
      "$(diff -u "$d/schema.sql" - <<<"$out" | head -20)"$'\n'"regenerate: scripts/schema-dump --write \$TC_PG_URL"
  fi
done

# The four databases are what db-migrate makes of their sets on an empty
# database, whether pg-tmp migrated them or copied them from its template
# cache (TX_PG_TEMPLATE_CACHE, which `make test` sets).
dump_db() { # URL
  pg_dump --schema-only --no-owner --no-privileges "$1" | grep -v -e '^\\restrict' -e '^\\unrestrict' -e '^-- Dumped'
}
fresh_url=${TC_PG_URL%/*}/txc_fresh_$$
for spec in "TC_PG_URL tc" "ORDERS_PG_URL rm orders" "STOCK_PG_URL rm stock consumer" "EVENTS_PG_URL consumer events"; do
  read -r var sets <<<"$spec"
  psql -X -q -d "${TC_PG_URL%/*}/postgres" -c "DROP DATABASE IF EXISTS txc_fresh_$$" -c "CREATE DATABASE txc_fresh_$$"
  # shellcheck disable=SC2086  # the set names are words
  if "$migrate" -q "$fresh_url" $sets && diff -u <(dump_db "$fresh_url") <(dump_db "${!var}") >"$sqldir/fresh.diff" 2>&1; then
    ok "${var%_PG_URL}: the database pg-tmp gave is what migrating '$sets' makes"
  else
    bad "${var%_PG_URL}: the database pg-tmp gave is what migrating '$sets' makes" "$(head -20 "$sqldir/fresh.diff")"
  fi
done
psql -X -q -d "${TC_PG_URL%/*}/postgres" -c "DROP DATABASE IF EXISTS txc_fresh_$$"

# Nothing left behind in the shared databases.
expect_value "tc: store tables left empty" "$TC_PG_URL" \
  "SELECT (SELECT count(*) FROM global_table) + (SELECT count(*) FROM branch_table) + (SELECT count(*) FROM lock_table)" "0"
expect_value "events: effect tables left empty" "$EVENTS_PG_URL" \
  "SELECT (SELECT count(*) FROM points_ledger) + (SELECT count(*) FROM member_notice)
        + (SELECT count(*) FROM issued_ticket) + (SELECT count(*) FROM consumed_event)" "0"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
