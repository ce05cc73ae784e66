-- sql/rm/003_lean_undo.sql - an undo row with one index entry instead of
-- three, and a queue table's statistics left alone (version 3).
--
-- Every AT branch writes one undo row and deletes it a moment later; each
-- index on the table costs an entry written (WAL the branch's commit
-- flushes) and one that vacuum must find again.  Two of the three did
-- little work:
--
--   * undo_log_pkey on id: librmclient finds a row by (xid, branch_id),
--     which the guard's unique key indexes already; the sweep and the
--     resolve pass now name rows by that key too.  The key becomes the
--     primary key (one index, undo_log_pkey, in place of the two); id stays, filled
--     by its sequence, so that a library of before this version, during an
--     upgrade, still reads and deletes rows by it (more slowly).
--   * undo_log_log_created_idx: read only by the sweep (every
--     sweep_interval_s, rows older than retention_s) and the resolve pass
--     (every resolve_interval_s, rows older than resolve_grace_s), both of
--     which now scan the table: it holds the undo rows of branches in
--     flight and those the deleter has not reached yet, a few thousand at
--     most on a busy service, and vacuum keeps its dead rows in check.
--
-- Statistics: with autovacuum_analyze_scale_factor 0.02 over a few hundred
-- live rows, the table was analyzed about every second under load; each
-- analyze rewrites its pg_statistic rows (WAL) and invalidates every
-- session's cached plans of it, so every connection plans its statements
-- on it again.  A queue table's statistics hardly change (a few live rows,
-- looked up by key): analyzed after 100,000 changed rows instead.  The
-- fence table (002) is a queue table too.
--
-- Never edit this file after it has shipped: add sql/rm/004_*.sql instead.

ALTER TABLE undo_log
  DROP CONSTRAINT undo_log_pkey,
  DROP CONSTRAINT undo_log_xid_branch_id_key,
  ADD CONSTRAINT undo_log_pkey PRIMARY KEY (xid, branch_id);
DROP INDEX undo_log_log_created_idx;
ALTER TABLE undo_log SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 100000);
ALTER TABLE branch_fence SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 100000);

COMMENT ON COLUMN undo_log.id IS
  'A number from the sequence, unused since version 3 (rows are named by (xid, branch_id), the primary key); '
  'kept for libraries of before it.';
COMMENT ON CONSTRAINT undo_log_pkey ON undo_log IS
  'One undo row per branch; also the guard''s key: a rollback that finds no undo row inserts a log_status = 1 '
  'row, so a late local commit of the same branch fails on it (no hanging branch).';
