-- sql/consumer/001_consumer.sql - what every consumer of the order events
-- keeps in its own database (version 1): the consumed-event keys that make
-- it idempotent, and its dead letters.
--
-- Applied with the consumer's own set, e.g. the stock database:
-- `scripts/db-migrate $STOCK_PG_URL rm stock consumer`.
-- examples/svc_consumer.c inserts the consumed_event row in the same local
-- transaction as the event's effect, so the effect happens at most once per
-- (consumer_group, biz_key) whatever the stream redelivers.  After N failed
-- deliveries (default 16) the event is written to dead_letter and
-- acknowledged; an operator redelivers it (txc-events redeliver), which
-- sets state REDELIVER; the consumer picks it up from here.
--
-- Never edit this file after it has shipped: add sql/consumer/002_*.sql instead.

CREATE TABLE consumed_event (
  consumer_group text        NOT NULL,
  biz_key        text        NOT NULL,
  event_id       bigint      NOT NULL,
  consumed_at    timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT consumed_event_pkey PRIMARY KEY (consumer_group, biz_key)
);

COMMENT ON TABLE consumed_event IS
  'One row per event a consumer group applied, written with its effect in one '
  'local transaction: the truth behind the Redis fast-path mark.';

CREATE TABLE dead_letter (
  id             bigint      GENERATED ALWAYS AS IDENTITY,
  consumer_group text        NOT NULL,
  biz_key        text        NOT NULL,
  event_id       bigint      NOT NULL,
  stream_id      text        NOT NULL,
  event          jsonb       NOT NULL,
  deliveries     integer     NOT NULL,
  reason         text        NOT NULL,
  state          text        NOT NULL DEFAULT 'DEAD',
  redeliveries   integer     NOT NULL DEFAULT 0,
  created_at     timestamptz NOT NULL DEFAULT now(),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT dead_letter_pkey PRIMARY KEY (id),
  CONSTRAINT dead_letter_event_key UNIQUE (consumer_group, biz_key),
  CONSTRAINT dead_letter_state_check CHECK (state IN ('DEAD', 'REDELIVER', 'REDELIVERED'))
);

-- The consumer's scan for what an operator asked to redeliver.
CREATE INDEX dead_letter_redeliver_idx ON dead_letter (consumer_group, id)
  WHERE state = 'REDELIVER';

COMMENT ON TABLE dead_letter IS
  'Events a consumer group gave up on after N deliveries (or at once, for a '
  'permanent refusal), with the last reason; state REDELIVER asks the consumer '
  'to try again, REDELIVERED records that it then applied it.';

COMMENT ON COLUMN consumed_event.consumer_group IS 'The consumer group (stock, points, ...).';
COMMENT ON COLUMN consumed_event.biz_key IS
  'What makes the event unique for its effect: "<event type>:<order id>".';
COMMENT ON COLUMN consumed_event.event_id IS 'order_outbox.event_id of the event applied.';
COMMENT ON COLUMN consumed_event.consumed_at IS 'When the effect committed.';
COMMENT ON COLUMN dead_letter.id IS 'Identity of the dead letter (txc-events redeliver --id).';
COMMENT ON COLUMN dead_letter.consumer_group IS 'The consumer group that gave up.';
COMMENT ON COLUMN dead_letter.biz_key IS '"<event type>:<order id>", or "malformed:<stream id>".';
COMMENT ON COLUMN dead_letter.event_id IS 'order_outbox.event_id (0 for a malformed entry).';
COMMENT ON COLUMN dead_letter.stream_id IS 'The entry id in the stream when it was given up.';
COMMENT ON COLUMN dead_letter.event IS 'The entry''s fields, as received.';
COMMENT ON COLUMN dead_letter.deliveries IS 'Deliveries that failed before it was given up.';
COMMENT ON COLUMN dead_letter.reason IS 'The last failure, for the operator.';
COMMENT ON COLUMN dead_letter.state IS
  'DEAD (given up), REDELIVER (an operator asked for another try), REDELIVERED (applied then).';
COMMENT ON COLUMN dead_letter.redeliveries IS 'Redeliveries tried so far.';
COMMENT ON COLUMN dead_letter.created_at IS 'When it was first given up.';
COMMENT ON COLUMN dead_letter.updated_at IS 'The last change of state.';
