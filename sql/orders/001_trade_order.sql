-- sql/orders/001_trade_order.sql - demo orders database (order-service), version 1.
--
-- Applied by scripts/db-migrate to the orders database together with the
-- "rm" set (undo_log): `scripts/db-migrate $ORDERS_PG_URL rm orders`.
-- Never edit this file after it has shipped: add sql/orders/002_*.sql instead.

CREATE SEQUENCE trade_order_id_seq AS bigint START WITH 1 CACHE 100;

COMMENT ON SEQUENCE trade_order_id_seq IS
  'Order ids for order-service (trade_order.order_id is not defaulted to it: '
  'the id is chosen before the global transaction begins and travels to the '
  'stock service and to Redis).';

CREATE TABLE trade_order (
  order_id    bigint      NOT NULL,
  activity_id bigint      NOT NULL,
  ticket_type integer     NOT NULL,
  user_id     bigint      NOT NULL,
  qty         integer     NOT NULL,
  status      text        NOT NULL DEFAULT 'UNPAID',
  bucket_id   integer     NOT NULL,
  xid         text,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  expire_at   timestamptz NOT NULL DEFAULT now() + interval '15 minutes',
  CONSTRAINT trade_order_pkey PRIMARY KEY (order_id),
  CONSTRAINT trade_order_qty_check CHECK (qty > 0),
  CONSTRAINT trade_order_status_check
    CHECK (status IN ('UNPAID', 'PAID', 'CANCELLED', 'EXPIRED')),
  CONSTRAINT trade_order_bucket_id_check CHECK (bucket_id >= 0),
  CONSTRAINT trade_order_xid_len CHECK (xid IS NULL OR octet_length(xid) BETWEEN 1 AND 128)
);

-- Per-user purchase limit and "my orders".
CREATE INDEX trade_order_activity_user_idx ON trade_order (activity_id, user_id);
-- Expiry job: WHERE status = 'UNPAID' AND expire_at < now().
CREATE INDEX trade_order_status_expire_idx ON trade_order (status, expire_at);

COMMENT ON TABLE trade_order IS
  'Flash-sale orders. Created UNPAID by order-service as the first branch of '
  'a global transaction (with stock frozen by the second); PAID confirms the '
  'frozen stock; CANCELLED and EXPIRED release it.';
COMMENT ON COLUMN trade_order.order_id IS
  'Order id (from trade_order_id_seq); also the key of stock_log and of the '
  'Redis freeze.';
COMMENT ON COLUMN trade_order.activity_id IS 'Sale (stock database: activity.activity_id).';
COMMENT ON COLUMN trade_order.ticket_type IS 'Ticket type within the activity.';
COMMENT ON COLUMN trade_order.user_id IS 'Buyer.';
COMMENT ON COLUMN trade_order.qty IS 'Number of tickets (> 0).';
COMMENT ON COLUMN trade_order.status IS
  'UNPAID (stock frozen), PAID (stock sold), CANCELLED (by the user, stock '
  'released) or EXPIRED (unpaid past expire_at, stock released).';
COMMENT ON COLUMN trade_order.bucket_id IS
  'Stock bucket the Redis prefilter froze the tickets in '
  '(activity_ticket_bucket.bucket_id).';
COMMENT ON COLUMN trade_order.xid IS
  'Global transaction that created the order; NULL for orders made in '
  'fallback-to-local mode.';
COMMENT ON COLUMN trade_order.created_at IS 'Creation time.';
COMMENT ON COLUMN trade_order.updated_at IS 'Last status change (set by the service).';
COMMENT ON COLUMN trade_order.expire_at IS
  'When an UNPAID order expires and its stock is released (default: freeze '
  'TTL of 15 minutes; the service may set its own).';
