-- sql/rm/002_branch_fence.sql - the fence of TCC and XA branches, version 2
-- of set "rm".
--
-- Applied by scripts/db-migrate (set "rm") to every database that TCC
-- (rm_tcc_try) or XA (rm_xa_start) branches write to.  Never edit this
-- file after it has shipped: add sql/rm/003_*.sql instead.
--
-- One row per branch, written in the same local transaction as the
-- business change it guards (librmclient's fence/rm_fence.c), so that the
-- fence and the business data cannot disagree:
--   * phase one (a TCC try, an XA branch's start) inserts (xid, branch_id)
--     as 1 tried; an XA branch's row commits with its COMMIT PREPARED;
--   * a TCC confirm or cancel locks the row, runs the handler, and sets 2
--     confirmed or 3 cancelled: at most once, and a duplicate is answered
--     from the row without running the handler again; an XA commit sets 2
--     after its COMMIT PREPARED;
--   * a rollback that finds no row inserts 4 rolled back before phase one
--     (the empty rollback, recorded): the late phase one's insert then
--     fails on the key and is refused, so it cannot hang a reservation (or
--     a prepared transaction) that no phase two will ever release.
-- A rollback that meets phase one's own uncommitted insert waits for it on
-- the primary key: it then sees either the committed row or no row at all.
--
-- Rows live from phase one to phase two, then for the sweep's retention
-- (finished rows only; a tried row waits for its phase two): a queue
-- table, with undo_log's autovacuum settings.

CREATE TABLE branch_fence (
  xid         text        NOT NULL,
  branch_id   bigint      NOT NULL,
  resource_id text        NOT NULL,
  branch_type smallint    NOT NULL,
  status      smallint    NOT NULL,
  args        text,
  created     timestamptz NOT NULL DEFAULT clock_timestamp(),
  modified    timestamptz NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT branch_fence_pkey PRIMARY KEY (xid, branch_id),
  CONSTRAINT branch_fence_xid_len CHECK (octet_length(xid) BETWEEN 1 AND 128),
  CONSTRAINT branch_fence_type_check CHECK (branch_type IN (1, 2, 3)),
  CONSTRAINT branch_fence_status_check CHECK (status IN (1, 2, 3, 4)),
  CONSTRAINT branch_fence_args_len CHECK (args IS NULL OR octet_length(args) <= 65536)
) WITH (
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 10000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_scale_factor = 0.02
);

-- The retention sweep of finished rows.
CREATE INDEX branch_fence_modified_idx ON branch_fence (modified) WHERE status <> 1;

COMMENT ON TABLE branch_fence IS
  'Fence of TCC and XA branches: one row per branch, written in the local '
  'transaction of its phase one and of its phase two; a confirm or cancel '
  'runs at most once, a rollback before phase one is recorded (status 4) so '
  'that a late phase one is refused.';
COMMENT ON COLUMN branch_fence.xid IS 'Global transaction id (at most 128 bytes).';
COMMENT ON COLUMN branch_fence.branch_id IS 'Branch id assigned by the TC (branch_table.branch_id).';
COMMENT ON COLUMN branch_fence.resource_id IS 'The resource whose handlers (TCC) or prepared transactions (XA) run.';
COMMENT ON COLUMN branch_fence.branch_type IS 'The branch type, as the TC numbers it: 1 TCC, 2 Saga, 3 XA.';
COMMENT ON COLUMN branch_fence.status IS
  '1 tried or prepared (phase two pending), 2 confirmed or committed, 3 '
  'cancelled or rolled back, 4 rolled back before phase one (an empty '
  'rollback: refuses a late phase one).';
COMMENT ON COLUMN branch_fence.args IS
  'What a TCC try recorded for its confirm and cancel (rm_tcc_try''s args), '
  'passed to the handlers; NULL if none.';
COMMENT ON COLUMN branch_fence.created IS 'When the row was written.';
COMMENT ON COLUMN branch_fence.modified IS 'Last change (phase two).';
