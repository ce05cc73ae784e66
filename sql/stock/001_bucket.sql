-- sql/stock/001_bucket.sql - demo stock database (stock-service), version 1.
--
-- Applied by scripts/db-migrate to the stock database together with the
-- "rm" set (undo_log): `scripts/db-migrate $STOCK_PG_URL rm stock`.
-- Never edit this file after it has shipped: add sql/stock/002_*.sql instead.
--
-- Stock of one ticket type is split into buckets (rows) so that concurrent
-- freezes spread over several rows instead of queueing on one hot row.
-- PostgreSQL is the truth; Redis holds a copy for the prefilter.

CREATE TABLE activity (
  activity_id    bigint      NOT NULL,
  name           text        NOT NULL,
  status         smallint    NOT NULL DEFAULT 0,
  per_user_limit integer     NOT NULL DEFAULT 2,
  starts_at      timestamptz NOT NULL,
  ends_at        timestamptz NOT NULL,
  CONSTRAINT activity_pkey PRIMARY KEY (activity_id),
  CONSTRAINT activity_status_check CHECK (status IN (0, 1, 2)),
  CONSTRAINT activity_per_user_limit_check CHECK (per_user_limit > 0),
  CONSTRAINT activity_time_check CHECK (ends_at > starts_at)
);

COMMENT ON TABLE activity IS 'Flash-sale activities (one sale event each).';
COMMENT ON COLUMN activity.activity_id IS 'Activity id (also in Redis keys: {activity}).';
COMMENT ON COLUMN activity.name IS 'Display name.';
COMMENT ON COLUMN activity.status IS '0 not started, 1 on sale, 2 ended.';
COMMENT ON COLUMN activity.per_user_limit IS
  'Most tickets one user may hold (UNPAID + PAID orders) in this activity.';
COMMENT ON COLUMN activity.starts_at IS 'Sale opens.';
COMMENT ON COLUMN activity.ends_at IS 'Sale closes.';

CREATE TABLE activity_ticket_bucket (
  activity_id  bigint  NOT NULL,
  ticket_type  integer NOT NULL,
  bucket_id    integer NOT NULL,
  stock        integer NOT NULL,
  frozen_count integer NOT NULL DEFAULT 0,
  sold_count   integer NOT NULL DEFAULT 0,
  CONSTRAINT activity_ticket_bucket_pkey PRIMARY KEY (activity_id, ticket_type, bucket_id),
  CONSTRAINT activity_ticket_bucket_activity_fkey
    FOREIGN KEY (activity_id) REFERENCES activity (activity_id),
  CONSTRAINT activity_ticket_bucket_bucket_id_check CHECK (bucket_id >= 0),
  -- Never oversold, enforced by the database itself whatever the caller does.
  CONSTRAINT activity_ticket_bucket_count_check CHECK (
    stock >= 0 AND frozen_count >= 0 AND sold_count >= 0
    AND frozen_count + sold_count <= stock)
) WITH (
  -- Hot rows (every freeze updates one): half-empty pages keep the updates
  -- HOT (no indexed column changes) so they are pruned in place.
  fillfactor = 50
);

COMMENT ON TABLE activity_ticket_bucket IS
  'Stock of one ticket type of one activity, split into buckets. A freeze is '
  'UPDATE ... SET frozen_count = frozen_count + n WHERE stock - frozen_count '
  '- sold_count >= n on one bucket; payment moves n from frozen_count to '
  'sold_count; release subtracts n from frozen_count.';
COMMENT ON COLUMN activity_ticket_bucket.activity_id IS 'activity.activity_id.';
COMMENT ON COLUMN activity_ticket_bucket.ticket_type IS 'Ticket type within the activity.';
COMMENT ON COLUMN activity_ticket_bucket.bucket_id IS 'Bucket number, 0 .. buckets-1.';
COMMENT ON COLUMN activity_ticket_bucket.stock IS 'Tickets in this bucket (fixed at seeding).';
COMMENT ON COLUMN activity_ticket_bucket.frozen_count IS
  'Tickets held by UNPAID orders.';
COMMENT ON COLUMN activity_ticket_bucket.sold_count IS 'Tickets of PAID orders.';

CREATE TABLE stock_log (
  id          bigserial   NOT NULL,
  activity_id bigint      NOT NULL,
  ticket_type integer     NOT NULL,
  bucket_id   integer     NOT NULL,
  order_id    bigint      NOT NULL,
  op          text        NOT NULL,
  qty         integer     NOT NULL,
  xid         text,
  created_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT stock_log_pkey PRIMARY KEY (id),
  -- Each operation happens at most once per order (idempotent retries).
  CONSTRAINT stock_log_order_op_key UNIQUE (order_id, op),
  CONSTRAINT stock_log_op_check CHECK (op IN ('freeze', 'confirm', 'release')),
  CONSTRAINT stock_log_qty_check CHECK (qty > 0),
  CONSTRAINT stock_log_xid_len CHECK (xid IS NULL OR octet_length(xid) BETWEEN 1 AND 128)
);

-- Reconciliation sums per bucket.
CREATE INDEX stock_log_bucket_idx ON stock_log (activity_id, ticket_type, bucket_id);

COMMENT ON TABLE stock_log IS
  'Ledger of stock operations, one row per (order, operation), written in the '
  'same local transaction as the bucket update: the UNIQUE (order_id, op) key '
  'makes freeze, confirm and release happen at most once per order.';
COMMENT ON COLUMN stock_log.id IS 'Surrogate key (insertion order).';
COMMENT ON COLUMN stock_log.activity_id IS 'activity_ticket_bucket.activity_id.';
COMMENT ON COLUMN stock_log.ticket_type IS 'activity_ticket_bucket.ticket_type.';
COMMENT ON COLUMN stock_log.bucket_id IS 'activity_ticket_bucket.bucket_id.';
COMMENT ON COLUMN stock_log.order_id IS 'trade_order.order_id (orders database).';
COMMENT ON COLUMN stock_log.op IS
  'freeze (frozen_count += qty), confirm (frozen -> sold) or release '
  '(frozen_count -= qty).';
COMMENT ON COLUMN stock_log.qty IS 'Tickets moved (> 0).';
COMMENT ON COLUMN stock_log.xid IS
  'Global transaction of the operation; NULL in fallback-to-local mode.';
COMMENT ON COLUMN stock_log.created_at IS 'When the operation was recorded.';
