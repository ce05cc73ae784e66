-- sql/orders/004_outbox.sql - the transactional outbox of the orders
-- database (version 4).
--
-- Only the purchase (order + stock freeze) is a global transaction.  Pay,
-- cancel and expiry change the order in one local transaction of this
-- database, and write their event here in that same transaction: the event
-- exists if and only if the change committed.  order-service's relay
-- (examples/svc_outbox.c) publishes committed events to a Redis stream in
-- stream_seq order; consumers (stock-service's freeze confirm/release, the
-- downstream groups) apply them idempotently.  This table stays the record:
-- the stream is only the delivery channel, so a Redis that lost recent
-- entries (a restart without AOF) is refilled from here by stream_seq.
--
-- Never edit this file after it has shipped: add sql/orders/005_*.sql instead.

CREATE TABLE order_outbox (
  event_id     bigint      GENERATED ALWAYS AS IDENTITY,
  event_type   text        NOT NULL,
  order_id     bigint      NOT NULL,
  payload      jsonb       NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  stream_seq   bigint,
  published_at timestamptz,
  CONSTRAINT order_outbox_pkey PRIMARY KEY (event_id),
  CONSTRAINT order_outbox_type_check
    CHECK (event_type IN ('order.paid', 'order.cancelled', 'order.expired')),
  -- One final event per order: an order leaves UNPAID once.
  CONSTRAINT order_outbox_order_key UNIQUE (order_id),
  CONSTRAINT order_outbox_seq_key UNIQUE (stream_seq),
  CONSTRAINT order_outbox_published_check
    CHECK ((stream_seq IS NULL) = (published_at IS NULL))
);

-- The relay's scan: what is not published yet, in commit-ish order.
CREATE INDEX order_outbox_unpublished_idx ON order_outbox (event_id)
  WHERE stream_seq IS NULL;

COMMENT ON TABLE order_outbox IS
  'Events of order state changes made in local transactions (pay, cancel, '
  'expiry), written in the same transaction as the change; published to the '
  'Redis stream txc:order-events by order-service''s relay.';
COMMENT ON COLUMN order_outbox.stream_seq IS
  'The entry id in the stream is <stream_seq>-0, assigned by the relay (one at '
  'a time, under an advisory lock) in increasing order at publication: event '
  'ids are taken at insert and commit out of order, stream ids must grow.';
COMMENT ON COLUMN order_outbox.payload IS
  'What consumers need without reading this database: activity, ticket_type, '
  'bucket, user, qty.';
COMMENT ON COLUMN order_outbox.event_id IS
  'Identity of the event (taken at insert; consumers see it as event_id).';
COMMENT ON COLUMN order_outbox.event_type IS
  'order.paid, order.cancelled or order.expired.';
COMMENT ON COLUMN order_outbox.order_id IS
  'The order whose state changed (trade_order.order_id).';
COMMENT ON COLUMN order_outbox.created_at IS
  'When the change committed (the event''s age is the outbox lag).';
COMMENT ON COLUMN order_outbox.published_at IS
  'When the relay published it; NULL until then.';
