-- sql/tc/012_queue_stats.sql - the queue tables' statistics left alone
-- (coordinator database, version 12).
--
-- global_table, branch_table and lock_table hold the live transactions
-- only: a few hundred rows under load, thousands inserted and deleted a
-- second.  With autovacuum_analyze_scale_factor 0.02 (001) each was
-- analyzed about every second: every analyze rewrites the table's
-- pg_statistic rows (WAL) and invalidates the cached plans of the batch
-- functions on every store connection, which then plan their statements
-- again (006's NOTES measured 2 ms for tc_register_batch alone).  Their
-- statistics hardly change (rows looked up by key), so they are analyzed
-- after 100,000 changed rows instead.  global_history, which grows, keeps
-- its settings.
--
-- Never edit this file after it has shipped: add sql/tc/013_*.sql instead.

ALTER TABLE global_table SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 100000);
ALTER TABLE branch_table SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 100000);
ALTER TABLE lock_table SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 100000);
