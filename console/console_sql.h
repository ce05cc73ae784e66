/*
 * console_sql.h - the console's queries, one JSON value each, so that
 * PostgreSQL builds the answer and the console passes it on.
 *
 * NOTES
 *   The tc queries take the status names as their first three
 *   parameters: $1 the global statuses, $2 the branch statuses, $3 the
 *   branch types, text arrays indexed by number + 1 (console_http.c builds
 *   them from proto/txp_status.h, the one list of names).  Every list has
 *   a LIMIT from the caller.  The store's tables are read as they are
 *   (sql/tc/schema.sql); tc_cluster_nodes() is the store's own view of
 *   the nodes and the leader.
 */
#ifndef CONSOLE_SQL_H
#define CONSOLE_SQL_H

static const char CONSOLE_SQL_OVERVIEW[] =
    "SELECT json_build_object("
    " 'nodes', (SELECT coalesce(json_agg(json_build_object('node_id', node_id, 'state', state, 'alive', alive,"
    "           'leader', is_leader, 'address', address, 'version', version, 'pid', pid, 'started_at', started_at,"
    "           'heartbeat_age_ms', heartbeat_age_ms) ORDER BY node_id), '[]'::json) FROM tc_cluster_nodes()),"
    " 'globals_by_status', (SELECT coalesce(json_agg(json_build_object('status', status,"
    "           'status_name', coalesce(($1::text[])[status + 1], status::text), 'count', n) ORDER BY status),"
    "           '[]'::json) FROM (SELECT status, count(*) AS n FROM global_table GROUP BY status) s),"
    " 'globals', (SELECT count(*) FROM global_table),"
    " 'branches', (SELECT count(*) FROM branch_table),"
    " 'locks', (SELECT count(*) FROM lock_table),"
    " 'finished_last_minute', (SELECT json_build_object('total', count(*),"
    "           'committed', count(*) FILTER (WHERE status = 9),"
    "           'rolled_back', count(*) FILTER (WHERE status IN (11, 12)),"
    "           'failed', count(*) FILTER (WHERE status IN (10, 13, 14)))"
    "      FROM global_history WHERE end_time > clock_timestamp() - interval '1 minute'),"
    " 'now', clock_timestamp())::text";

/* $4 limit */
static const char CONSOLE_SQL_GLOBALS[] =
    "SELECT json_build_object('count', (SELECT count(*) FROM global_table), 'globals',"
    " (SELECT coalesce(json_agg(json_build_object('xid', g.xid, 'status', g.status,"
    "     'status_name', coalesce(($1::text[])[g.status + 1], g.status::text),"
    "     'application_id', g.application_id, 'name', g.transaction_name, 'node_id', g.node_id,"
    "     'begin_time', g.begin_time, 'deadline', g.deadline, 'timeout_ms', g.timeout_ms,"
    "     'age_ms', (extract(epoch FROM clock_timestamp() - g.begin_time) * 1000)::bigint,"
    "     'retry_count', g.retry_count, 'next_retry_at', g.next_retry_at, 'last_error', g.last_error,"
    "     'locks', (SELECT count(*) FROM lock_table l WHERE l.xid = g.xid),"
    "     'branches', (SELECT coalesce(json_agg(json_build_object('branch_id', b.branch_id,"
    "         'resource_id', b.resource_id, 'type', coalesce(($3::text[])[b.branch_type + 1], b.branch_type::text),"
    "         'status', coalesce(($2::text[])[b.status + 1], b.status::text), 'lock_keys', b.lock_keys,"
    "         'retry_count', b.retry_count, 'last_error', b.last_error) ORDER BY b.branch_id), '[]'::json)"
    "       FROM branch_table b WHERE b.xid = g.xid)) ORDER BY g.begin_time, g.xid), '[]'::json)"
    "    FROM (SELECT * FROM global_table ORDER BY begin_time, xid LIMIT $4::int) g))::text";

/* $4 xid: the live global, else its history row, else null */
static const char CONSOLE_SQL_GLOBAL[] =
    "SELECT coalesce("
    " (SELECT json_build_object('live', true, 'xid', g.xid, 'status', g.status,"
    "     'status_name', coalesce(($1::text[])[g.status + 1], g.status::text),"
    "     'application_id', g.application_id, 'name', g.transaction_name, 'node_id', g.node_id,"
    "     'begin_time', g.begin_time, 'deadline', g.deadline, 'retry_count', g.retry_count,"
    "     'last_error', g.last_error,"
    "     'branches', (SELECT coalesce(json_agg(json_build_object('branch_id', b.branch_id,"
    "         'resource_id', b.resource_id, 'type', coalesce(($3::text[])[b.branch_type + 1], b.branch_type::text),"
    "         'status', coalesce(($2::text[])[b.status + 1], b.status::text), 'lock_keys', b.lock_keys,"
    "         'retry_count', b.retry_count, 'last_error', b.last_error) ORDER BY b.branch_id), '[]'::json)"
    "       FROM branch_table b WHERE b.xid = g.xid),"
    "     'locks', (SELECT coalesce(json_agg(json_build_object('row_key', l.row_key, 'branch_id', l.branch_id,"
    "         'status', CASE l.status WHEN 0 THEN 'locked' ELSE 'rollbacking' END, 'since', l.gmt_create)"
    "         ORDER BY l.row_key), '[]'::json) FROM lock_table l WHERE l.xid = g.xid))"
    "    FROM global_table g WHERE g.xid = $4),"
    " (SELECT json_build_object('live', false, 'xid', h.xid, 'status', h.status,"
    "     'status_name', coalesce(($1::text[])[h.status + 1], h.status::text),"
    "     'application_id', h.application_id, 'name', h.transaction_name, 'begin_time', h.begin_time,"
    "     'end_time', h.end_time, 'branches', tc_history_branches(h.branches), 'locks', '[]'::json)"
    "    FROM global_history h WHERE h.xid = $4),"
    " 'null'::json)::text";

/* $4 limit */
static const char CONSOLE_SQL_LOCKS[] =
    "SELECT json_build_object('count', (SELECT count(*) FROM lock_table), 'locks',"
    " (SELECT coalesce(json_agg(json_build_object('row_key', l.row_key, 'xid', l.xid, 'branch_id', l.branch_id,"
    "     'resource_id', l.resource_id, 'table', l.table_name, 'pk', l.pk,"
    "     'status', CASE l.status WHEN 0 THEN 'locked' ELSE 'rollbacking' END, 'since', l.gmt_create,"
    "     'holder_status', coalesce(($1::text[])[g.status + 1], g.status::text))"
    "     ORDER BY l.gmt_create, l.row_key), '[]'::json)"
    "    FROM (SELECT * FROM lock_table ORDER BY gmt_create, row_key LIMIT $4::int) l"
    "    LEFT JOIN global_table g ON g.xid = l.xid),"
    " 'nodes', (SELECT coalesce(json_agg(json_build_object('node_id', node_id, 'admin_socket', admin_socket))"
    "           FILTER (WHERE alive AND admin_socket IS NOT NULL), '[]'::json) FROM tc_cluster_nodes()))::text";

/* $4 xid prefix, $5 status, $6 application, $7 name, $8 minutes, $9 limit */
static const char CONSOLE_SQL_HISTORY[] =
    "SELECT json_build_object('history',"
    " (SELECT coalesce(json_agg(json_build_object('xid', h.xid, 'status', h.status,"
    "     'status_name', coalesce(($1::text[])[h.status + 1], h.status::text),"
    "     'application_id', h.application_id, 'name', h.transaction_name, 'begin_time', h.begin_time,"
    "     'end_time', h.end_time,"
    "     'duration_ms', round(extract(epoch FROM h.end_time - h.begin_time) * 1000, 1),"
    "     'branches', jsonb_array_length(h.branches)) ORDER BY h.end_time DESC, h.xid), '[]'::json)"
    "    FROM (SELECT * FROM global_history"
    "           WHERE end_time > clock_timestamp() - $8::int * interval '1 minute'"
    "             AND ($4::text IS NULL OR left(xid, length($4::text)) = $4::text)"
    "             AND ($5::int IS NULL OR status = $5::int)"
    "             AND ($6::text IS NULL OR application_id = $6::text)"
    "             AND ($7::text IS NULL OR transaction_name = $7::text)"
    "           ORDER BY end_time DESC, xid LIMIT $9::int) h))::text";

/* stock database; $1 limit */
static const char CONSOLE_SQL_ACTIVITIES[] =
    "SELECT coalesce(json_agg(json_build_object('activity_id', a.activity_id, 'name', a.name,"
    "   'status', CASE a.status WHEN 0 THEN 'not started' WHEN 1 THEN 'on sale' ELSE 'ended' END,"
    "   'starts_at', a.starts_at, 'ends_at', a.ends_at, 'buckets', b.n, 'stock', b.s, 'frozen', b.f, 'sold', b.so,"
    "   'available', b.s - b.f - b.so) ORDER BY a.activity_id DESC), '[]'::json)::text"
    "  FROM (SELECT * FROM activity ORDER BY activity_id DESC LIMIT $1::int) a"
    "  CROSS JOIN LATERAL (SELECT count(*) AS n, coalesce(sum(stock), 0) AS s, coalesce(sum(frozen_count), 0) AS f,"
    "                             coalesce(sum(sold_count), 0) AS so"
    "                        FROM activity_ticket_bucket t WHERE t.activity_id = a.activity_id) b";

/* stock database; $1 activity */
static const char CONSOLE_SQL_SALE[] =
    "SELECT coalesce((SELECT json_build_object('activity_id', a.activity_id, 'name', a.name,"
    "   'status', CASE a.status WHEN 0 THEN 'not started' WHEN 1 THEN 'on sale' ELSE 'ended' END,"
    "   'per_user_limit', a.per_user_limit, 'starts_at', a.starts_at, 'ends_at', a.ends_at,"
    "   'buckets', (SELECT coalesce(json_agg(json_build_object('ticket_type', t.ticket_type, 'bucket_id', t.bucket_id,"
    "       'stock', t.stock, 'frozen', t.frozen_count, 'sold', t.sold_count,"
    "       'available', t.stock - t.frozen_count - t.sold_count) ORDER BY t.ticket_type, t.bucket_id), '[]'::json)"
    "     FROM activity_ticket_bucket t WHERE t.activity_id = a.activity_id))"
    "  FROM activity a WHERE a.activity_id = $1::bigint), 'null'::json)::text";

/* orders database; $1 activity */
static const char CONSOLE_SQL_SALE_ORDERS[] =
    "SELECT json_build_object('orders_by_status', coalesce(json_object_agg(status, n), '{}'::json),"
    "                         'tickets_by_status', coalesce(json_object_agg(status, q), '{}'::json))::text"
    "  FROM (SELECT status, count(*) AS n, sum(qty) AS q FROM trade_order WHERE activity_id = $1::bigint"
    "         GROUP BY status) s";

#endif /* CONSOLE_SQL_H */
