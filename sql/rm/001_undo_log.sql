-- sql/rm/001_undo_log.sql - the resource manager's undo log, version 1.
--
-- Applied by scripts/db-migrate (set "rm") to every database that AT-mode
-- branches write to: in the demo, the orders and the stock databases.
-- Never edit this file after it has shipped: add sql/rm/002_*.sql instead.
--
-- One row per branch.  librmclient writes it in the branch's local
-- transaction, together with the business change; phase-2 commit deletes it
-- (in batches); phase-2 rollback locks it, checks the current rows against
-- the after images, restores the before images and deletes it, all in one
-- local transaction, so an undo is applied at most once.
--
-- Rows live from phase 1 to phase 2 (milliseconds to seconds): a queue table,
-- with the same autovacuum settings as the TC's (see sql/tc/001_store.sql).

CREATE TABLE undo_log (
  id            bigserial   NOT NULL,
  branch_id     bigint      NOT NULL,
  xid           text        NOT NULL,
  context       text,
  rollback_info jsonb,
  log_status    smallint    NOT NULL DEFAULT 0,
  log_created   timestamptz NOT NULL DEFAULT clock_timestamp(),
  log_modified  timestamptz NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT undo_log_pkey PRIMARY KEY (id),
  -- The guard: a rollback that finds no undo row inserts a log_status = 1
  -- row, so a late local commit of the same branch fails on this key.
  CONSTRAINT undo_log_xid_branch_id_key UNIQUE (xid, branch_id),
  CONSTRAINT undo_log_xid_len CHECK (octet_length(xid) BETWEEN 1 AND 128),
  CONSTRAINT undo_log_log_status_check CHECK (log_status IN (0, 1)),
  CONSTRAINT undo_log_rollback_info_check
    CHECK (log_status = 1 OR rollback_info IS NOT NULL)
) WITH (
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 10000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_scale_factor = 0.02,
  toast.autovacuum_vacuum_scale_factor = 0,
  toast.autovacuum_vacuum_threshold = 10000,
  toast.autovacuum_vacuum_insert_scale_factor = 0,
  toast.autovacuum_vacuum_insert_threshold = 10000
);

-- The sweep that removes rows left behind by a crash (and old guard rows).
CREATE INDEX undo_log_log_created_idx ON undo_log (log_created);

COMMENT ON TABLE undo_log IS
  'AT-mode undo log: one row per branch that changed this database, written '
  'in the branch''s local transaction; deleted by phase-2 commit, replayed '
  'and deleted by phase-2 rollback. A log_status = 1 row is a guard left by '
  'a rollback that found no undo row.';
COMMENT ON COLUMN undo_log.id IS 'Surrogate key (ordering for sweeps and batches).';
COMMENT ON COLUMN undo_log.branch_id IS 'Branch id assigned by the TC (branch_table.branch_id).';
COMMENT ON COLUMN undo_log.xid IS 'Global transaction id (at most 128 bytes).';
COMMENT ON COLUMN undo_log.context IS
  'Serialisation context, e.g. "serializer=json;delta=1" (librmclient''s '
  'format and flags for rollback_info).';
COMMENT ON COLUMN undo_log.rollback_info IS
  'The undo itself, written by librmclient: the statements of the branch '
  'with table, primary key, before image and after image of each row (or, '
  'for a delta branch, the column and the amount to subtract). NULL only in '
  'guard rows (log_status = 1).';
COMMENT ON COLUMN undo_log.log_status IS
  '0 normal (undo pending phase 2); 1 global-finished guard: inserted by a '
  'rollback that found no undo row, so that a late local commit of the '
  'branch fails on UNIQUE (xid, branch_id) and leaves no hanging branch.';
COMMENT ON COLUMN undo_log.log_created IS 'When the row was written.';
COMMENT ON COLUMN undo_log.log_modified IS 'Last change time.';
