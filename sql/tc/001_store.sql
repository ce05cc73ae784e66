-- sql/tc/001_store.sql - the coordinator's (tcd) store, version 1.
--
-- Applied by scripts/db-migrate to the TC database (set "tc"), inside one
-- transaction, once; never edit this file after it has shipped: add
-- sql/tc/002_*.sql instead.
--
-- Names follow Seata's DB store (global_table, branch_table, lock_table) so
-- that operators who know Seata can read these tables without a dictionary.
-- Status numbers are Seata's; the authoritative list is proto/txp_status.h
-- (txp_global_status_t, txp_branch_status_t, txp_branch_type_t).
--
-- global_table, branch_table and lock_table are queue tables: a row lives for
-- milliseconds (insert, one or two updates, delete).  Default autovacuum lets
-- them bloat by tens of MB/s and throughput falls ~30% within seconds
-- (/work/shared/PERF-LIMITS.md), so each carries its own storage parameters:
--   * autovacuum_vacuum[_insert]_scale_factor = 0, *_threshold = 10000:
--     vacuum after every ~10k dead (or inserted) rows, whatever the table's
--     size, instead of after 20% of a table whose size swings between 0 and
--     100k rows;
--   * fillfactor = 80: leave room on each page so status updates are HOT
--     (no new index entries), which is also why the hot-path columns that get
--     updated (status, gmt_modified, retry_count) are in no index;
--   * the same for their TOAST tables (lock_keys, application_data and
--     branches can be long).
-- The test server (scripts/pg-tmp) also sets autovacuum_naptime = 1s and
-- autovacuum_vacuum_cost_delay = 0; production servers should too.

-- Ids ---------------------------------------------------------------------

CREATE SEQUENCE tc_id_seq AS bigint START WITH 1 INCREMENT BY 1 CACHE 1000;

COMMENT ON SEQUENCE tc_id_seq IS
  'Source of global transaction ids (global_table.transaction_id) and branch '
  'ids (branch_table.branch_id). One sequence shared by every tcd node, so ids '
  'are unique across the cluster; CACHE 1000 hands each backend a block of '
  '1000 values in memory, so a burst costs no sequence I/O (ids are unique '
  'but not gap-free nor ordered across nodes). Batch: '
  'SELECT nextval(''tc_id_seq'') FROM generate_series(1, $1).';

-- Global sessions -----------------------------------------------------------

CREATE TABLE global_table (
  xid              text        NOT NULL,
  transaction_id   bigint      NOT NULL,
  status           smallint    NOT NULL,
  application_id   text,
  transaction_name text,
  timeout_ms       integer     NOT NULL,
  begin_time       timestamptz NOT NULL DEFAULT clock_timestamp(),
  deadline         timestamptz NOT NULL,
  node_id          integer     NOT NULL,
  idem_key         text,
  retry_count      integer     NOT NULL DEFAULT 0,
  next_retry_at    timestamptz,
  last_error       text,
  gmt_create       timestamptz NOT NULL DEFAULT clock_timestamp(),
  gmt_modified     timestamptz NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT global_table_pkey PRIMARY KEY (xid),
  CONSTRAINT global_table_transaction_id_key UNIQUE (transaction_id),
  CONSTRAINT global_table_idem_key_key UNIQUE (idem_key),
  CONSTRAINT global_table_xid_len CHECK (octet_length(xid) BETWEEN 1 AND 128),
  CONSTRAINT global_table_status_check CHECK (status >= 0),
  CONSTRAINT global_table_timeout_check CHECK (timeout_ms > 0),
  CONSTRAINT global_table_retry_count_check CHECK (retry_count >= 0)
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

-- Timeout scan: WHERE deadline < now() AND status IN (...).  deadline never
-- changes after insert, so this index does not prevent HOT status updates.
CREATE INDEX global_table_deadline_idx ON global_table (deadline);
-- Retry scan (commit/rollback retries with backoff); only retrying rows have
-- next_retry_at, so the index stays tiny and the fast path never touches it.
CREATE INDEX global_table_next_retry_idx ON global_table (next_retry_at)
  WHERE next_retry_at IS NOT NULL;

COMMENT ON TABLE global_table IS
  'Global transactions that are not finished yet (one row per xid). Queue '
  'table: inserted at GlobalBegin, deleted once every branch has finished '
  'phase 2 (a copy goes to global_history). All decisions live here, never '
  'only in a node''s memory, so any tcd node can serve any xid.';
COMMENT ON COLUMN global_table.xid IS
  'Global transaction id as sent on the wire (at most 128 bytes, '
  'TXP_MAX_XID_LEN), e.g. "<node address>:<transaction_id>".';
COMMENT ON COLUMN global_table.transaction_id IS
  'Numeric id from tc_id_seq; unique across nodes.';
COMMENT ON COLUMN global_table.status IS
  'txp_global_status_t (Seata GlobalStatus numbers): 1 Begin, 2 Committing, '
  '3 CommitRetrying, 4 Rollbacking, 5 RollbackRetrying, 6 TimeoutRollbacking, '
  '7 TimeoutRollbackRetrying, 8 AsyncCommitting, 9 Committed, ... see '
  'proto/txp_status.h. Changed only by compare-and-set '
  '(UPDATE ... WHERE status = <expected>).';
COMMENT ON COLUMN global_table.application_id IS
  'Application id the TM sent with GlobalBegin (informational).';
COMMENT ON COLUMN global_table.transaction_name IS
  'Transaction name the TM sent with GlobalBegin (informational).';
COMMENT ON COLUMN global_table.timeout_ms IS
  'Timeout requested at GlobalBegin, in milliseconds.';
COMMENT ON COLUMN global_table.begin_time IS
  'When the global transaction began (clock_timestamp() of the insert).';
COMMENT ON COLUMN global_table.deadline IS
  'begin_time + timeout_ms, computed by tcd at insert; past it the leader''s '
  'timeout job rolls the transaction back if it is still Begin.';
COMMENT ON COLUMN global_table.node_id IS
  'node_table.node_id of the tcd node that began the transaction (clients '
  'prefer that node for this xid while it is alive; any node may serve it).';
COMMENT ON COLUMN global_table.idem_key IS
  'Optional client idempotency key of GlobalBegin: a retried begin with the '
  'same key returns the existing xid instead of starting a second '
  'transaction. NULL when the client sent none (NULLs never conflict).';
COMMENT ON COLUMN global_table.retry_count IS
  'Phase-2 commit/rollback attempts that failed so far (drives backoff).';
COMMENT ON COLUMN global_table.next_retry_at IS
  'When the leader retries phase 2 next; NULL while no retry is pending.';
COMMENT ON COLUMN global_table.last_error IS
  'Last phase-2 error (for operators: tcctl show), NULL if none.';
COMMENT ON COLUMN global_table.gmt_create IS 'Row creation time.';
COMMENT ON COLUMN global_table.gmt_modified IS
  'Last change time; set by tcd in each UPDATE (no trigger on the hot path).';

-- Branch sessions -----------------------------------------------------------

CREATE TABLE branch_table (
  branch_id        bigint      NOT NULL,
  xid              text        NOT NULL,
  transaction_id   bigint      NOT NULL,
  resource_id      text        NOT NULL,
  branch_type      smallint    NOT NULL DEFAULT 0,
  status           smallint    NOT NULL,
  lock_keys        text,
  application_data text,
  client_id        text,
  idem_key         text,
  retry_count      integer     NOT NULL DEFAULT 0,
  next_retry_at    timestamptz,
  last_error       text,
  gmt_create       timestamptz NOT NULL DEFAULT clock_timestamp(),
  gmt_modified     timestamptz NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT branch_table_pkey PRIMARY KEY (branch_id),
  -- Leading column xid: this index is also the index for "branches of xid".
  CONSTRAINT branch_table_xid_idem_key_key UNIQUE (xid, idem_key),
  CONSTRAINT branch_table_xid_len CHECK (octet_length(xid) BETWEEN 1 AND 128),
  CONSTRAINT branch_table_status_check CHECK (status >= 0),
  CONSTRAINT branch_table_branch_type_check CHECK (branch_type >= 0),
  CONSTRAINT branch_table_retry_count_check CHECK (retry_count >= 0)
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

CREATE INDEX branch_table_next_retry_idx ON branch_table (next_retry_at)
  WHERE next_retry_at IS NOT NULL;

COMMENT ON TABLE branch_table IS
  'Branches of unfinished global transactions (one row per BranchRegister). '
  'Queue table: deleted with its global transaction. No foreign key to '
  'global_table (the hot path must not pay for it): tcd inserts and deletes '
  'both in the same PostgreSQL transactions.';
COMMENT ON COLUMN branch_table.branch_id IS
  'Branch id from tc_id_seq; unique across nodes.';
COMMENT ON COLUMN branch_table.xid IS
  'Global transaction (global_table.xid). Indexed through the unique index '
  'on (xid, idem_key), whose leading column it is.';
COMMENT ON COLUMN branch_table.transaction_id IS
  'global_table.transaction_id of the same transaction (denormalised).';
COMMENT ON COLUMN branch_table.resource_id IS
  'Resource (the RM''s database) the branch ran on; phase-2 requests go to '
  'an RM that serves this resource.';
COMMENT ON COLUMN branch_table.branch_type IS
  'txp_branch_type_t: 0 AT, 1 TCC, 2 SAGA, 3 XA.';
COMMENT ON COLUMN branch_table.status IS
  'txp_branch_status_t (Seata BranchStatus numbers): 1 Registered, '
  '2 PhaseOne_Done, 3 PhaseOne_Failed, 5 PhaseTwo_Committed, '
  '8 PhaseTwo_Rollbacked, ... see proto/txp_status.h.';
COMMENT ON COLUMN branch_table.lock_keys IS
  'Lock keys exactly as registered (unbounded text, never truncated); the '
  'individual keys are rows of lock_table. NULL or empty for branches that '
  'take no global lock (delta branches on hot-row counters).';
COMMENT ON COLUMN branch_table.application_data IS
  'Opaque data the RM attached at registration (e.g. "delta" marker).';
COMMENT ON COLUMN branch_table.client_id IS
  'Identity of the RM connection that registered the branch.';
COMMENT ON COLUMN branch_table.idem_key IS
  'Optional idempotency key of BranchRegister, unique per xid: a retried '
  'register returns the existing branch_id. NULL = none.';
COMMENT ON COLUMN branch_table.retry_count IS
  'Phase-2 attempts on this branch that failed so far.';
COMMENT ON COLUMN branch_table.next_retry_at IS
  'When phase 2 of this branch is retried next; NULL if none pending.';
COMMENT ON COLUMN branch_table.last_error IS
  'Last phase-2 error reported by the RM (e.g. a dirty write), NULL if none.';
COMMENT ON COLUMN branch_table.gmt_create IS 'Row creation time.';
COMMENT ON COLUMN branch_table.gmt_modified IS
  'Last change time; set by tcd in each UPDATE.';

-- Global row locks ----------------------------------------------------------

CREATE TABLE lock_table (
  row_key        text        NOT NULL,
  xid            text        NOT NULL,
  transaction_id bigint      NOT NULL,
  branch_id      bigint      NOT NULL,
  resource_id    text        NOT NULL,
  table_name     text        NOT NULL,
  pk             text        NOT NULL,
  status         smallint    NOT NULL DEFAULT 0,
  gmt_create     timestamptz NOT NULL DEFAULT clock_timestamp(),
  CONSTRAINT lock_table_pkey PRIMARY KEY (row_key),
  -- A btree entry must fit in a third of a page (2704 bytes after
  -- compression); this limit makes an over-long key fail with a clear,
  -- deterministic error instead of an "index row size" error that depends on
  -- how well the key compresses.  Keys are stored whole, never truncated.
  CONSTRAINT lock_table_row_key_len CHECK (octet_length(row_key) BETWEEN 1 AND 2048),
  CONSTRAINT lock_table_xid_len CHECK (octet_length(xid) BETWEEN 1 AND 128),
  CONSTRAINT lock_table_status_check CHECK (status IN (0, 1))
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

CREATE INDEX lock_table_xid_idx ON lock_table (xid);
CREATE INDEX lock_table_branch_id_idx ON lock_table (branch_id);

COMMENT ON TABLE lock_table IS
  'Global row locks (AT mode): one row per locked business row. The primary '
  'key is the conflict check: BranchRegister does INSERT ... ON CONFLICT '
  '(row_key) DO NOTHING in the same PostgreSQL transaction that inserts the '
  'branch, and a key held by another xid is a conflict (the registration '
  'waits in the TC''s FIFO queue). Rows are deleted when their global '
  'transaction commits or finishes rolling back.';
COMMENT ON COLUMN lock_table.row_key IS
  'The full key "resource^^^table^^^pk", stored whole (never truncated; at '
  'most 2048 bytes, see constraint lock_table_row_key_len).';
COMMENT ON COLUMN lock_table.xid IS 'Holder: global_table.xid.';
COMMENT ON COLUMN lock_table.transaction_id IS
  'Holder: global_table.transaction_id.';
COMMENT ON COLUMN lock_table.branch_id IS
  'Holder: branch_table.branch_id of the branch that registered the lock.';
COMMENT ON COLUMN lock_table.resource_id IS 'Resource part of row_key.';
COMMENT ON COLUMN lock_table.table_name IS 'Table part of row_key.';
COMMENT ON COLUMN lock_table.pk IS 'Primary-key part of row_key.';
COMMENT ON COLUMN lock_table.status IS
  '0 locked; 1 rollbacking (the holder is rolling back: its own rollback may '
  'proceed, others keep waiting).';
COMMENT ON COLUMN lock_table.gmt_create IS 'When the lock was taken.';

-- Cluster members -------------------------------------------------------------

CREATE TABLE node_table (
  node_id      integer     NOT NULL,
  address      text        NOT NULL,
  admin_socket text,
  started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  is_leader    boolean     NOT NULL DEFAULT false,
  pid          integer,
  version      text,
  CONSTRAINT node_table_pkey PRIMARY KEY (node_id)
);

COMMENT ON TABLE node_table IS
  'tcd nodes of the cluster, one row per configured node id, upserted at '
  'start and refreshed by heartbeat. Informational: leadership itself is a '
  'PostgreSQL advisory lock held on the leader''s connection, not this table.';
COMMENT ON COLUMN node_table.node_id IS 'Node id from the node''s configuration.';
COMMENT ON COLUMN node_table.address IS 'host:port where the node serves clients.';
COMMENT ON COLUMN node_table.admin_socket IS 'Path of the node''s admin Unix socket.';
COMMENT ON COLUMN node_table.started_at IS 'When the node process started.';
COMMENT ON COLUMN node_table.heartbeat_at IS
  'Last heartbeat written by the node; a node whose heartbeat is older than a '
  'few intervals is considered dead.';
COMMENT ON COLUMN node_table.is_leader IS
  'Whether the node reported holding the leader advisory lock at its last '
  'heartbeat (a hint for operators; the lock is the truth).';
COMMENT ON COLUMN node_table.pid IS 'Process id of the node (on its host).';
COMMENT ON COLUMN node_table.version IS 'tcd version string.';

-- History -----------------------------------------------------------------------

CREATE TABLE global_history (
  xid              text        NOT NULL,
  transaction_id   bigint      NOT NULL,
  status           smallint    NOT NULL,
  application_id   text,
  transaction_name text,
  begin_time       timestamptz NOT NULL,
  end_time         timestamptz NOT NULL DEFAULT clock_timestamp(),
  branches         jsonb       NOT NULL DEFAULT '[]'::jsonb,
  CONSTRAINT global_history_pkey PRIMARY KEY (xid),
  CONSTRAINT global_history_xid_len CHECK (octet_length(xid) BETWEEN 1 AND 128)
);

-- Pruning (DELETE ... WHERE end_time < now() - retention) and "recent" listings.
CREATE INDEX global_history_end_time_idx ON global_history (end_time);

COMMENT ON TABLE global_history IS
  'Finished global transactions, for inspection (tcctl, tests): written when '
  'a transaction leaves global_table, pruned by the leader after a retention '
  'period.';
COMMENT ON COLUMN global_history.xid IS 'global_table.xid.';
COMMENT ON COLUMN global_history.transaction_id IS 'global_table.transaction_id.';
COMMENT ON COLUMN global_history.status IS
  'Final txp_global_status_t (9 Committed, 11 Rollbacked, 12 '
  'TimeoutRollbacked, 13 RollbackFailed, ...).';
COMMENT ON COLUMN global_history.application_id IS 'As in global_table.';
COMMENT ON COLUMN global_history.transaction_name IS 'As in global_table.';
COMMENT ON COLUMN global_history.begin_time IS 'As in global_table.';
COMMENT ON COLUMN global_history.end_time IS 'When the transaction finished.';
COMMENT ON COLUMN global_history.branches IS
  'The branches at the end, as a JSON array of objects '
  '(branch_id, resource_id, branch_type, status, lock_keys, last_error).';
