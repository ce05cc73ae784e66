-- sql/rm/002_tcc_fence.sql - the TCC fence, version 2 of set "rm".
--
-- Applied by scripts/db-migrate (set "rm") to every database that TCC
-- branches (rm_tcc_try) write to.  Never edit this file after it has
-- shipped: add sql/rm/003_*.sql instead.
--
-- One row per TCC branch, written in the same local transaction as the
-- business change of its try, its confirm or its cancel (librmclient's
-- tcc/rm_tcc.c), so the fence and the business data cannot disagree:
--   * a try inserts (xid, branch_id) as 1 tried;
--   * a confirm or cancel locks the row, runs the handler, and sets 2
--     confirmed or 3 cancelled: at most once, and a duplicate is answered
--     from the row without running the handler again;
--   * a cancel that finds no row inserts 4 cancelled before any try (the
--     empty rollback, recorded): the late try's insert then fails on the
--     key and the try is refused, so it cannot hang a reservation that no
--     phase two will ever release.
-- A cancel that meets the try's own uncommitted insert waits for it on the
-- primary key: it then sees either the committed try or no row at all.
--
-- Rows live from the try to phase two, then for the sweep's retention
-- (finished rows only; a tried row waits for its phase two forever): a
-- queue table, with undo_log's autovacuum settings.

CREATE TABLE tcc_fence (
  xid         text        NOT NULL,
  branch_id   bigint      NOT NULL,
  resource_id text        NOT NULL,
  status      smallint    NOT NULL,
  args        text,
  created     timestamptz NOT NULL DEFAULT clock_timestamp(),
  modified    timestamptz NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT tcc_fence_pkey PRIMARY KEY (xid, branch_id),
  CONSTRAINT tcc_fence_xid_len CHECK (octet_length(xid) BETWEEN 1 AND 128),
  CONSTRAINT tcc_fence_status_check CHECK (status IN (1, 2, 3, 4)),
  CONSTRAINT tcc_fence_args_len CHECK (args IS NULL OR octet_length(args) <= 65536)
) WITH (
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 10000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_scale_factor = 0.02
);

-- The retention sweep of finished rows.
CREATE INDEX tcc_fence_modified_idx ON tcc_fence (modified) WHERE status <> 1;

COMMENT ON TABLE tcc_fence IS
  'TCC fence: one row per TCC branch, written in the local transaction of '
  'its try, confirm or cancel; confirm and cancel run at most once, a '
  'cancel before any try is recorded (status 4) so that a late try is '
  'refused.';
COMMENT ON COLUMN tcc_fence.xid IS 'Global transaction id (at most 128 bytes).';
COMMENT ON COLUMN tcc_fence.branch_id IS 'Branch id assigned by the TC (branch_table.branch_id).';
COMMENT ON COLUMN tcc_fence.resource_id IS 'The TCC resource (rm_tcc_resource_add) whose handlers run.';
COMMENT ON COLUMN tcc_fence.status IS
  '1 tried (phase two pending), 2 confirmed, 3 cancelled, 4 cancelled before '
  'any try (an empty rollback: refuses a late try).';
COMMENT ON COLUMN tcc_fence.args IS
  'What the try recorded for its confirm and cancel (rm_tcc_try''s args), '
  'passed to the handlers; NULL if none.';
COMMENT ON COLUMN tcc_fence.created IS 'When the row was written.';
COMMENT ON COLUMN tcc_fence.modified IS 'Last change (phase two).';
