-- sql/events/001_downstream.sql - the effects of the downstream consumers
-- of the order events (events database, version 1).
--
-- examples/event_consumers.c runs three consumer groups on this database,
-- each applying order.paid (and ignoring the other types):
--   points   one points_ledger row per paid order (qty * 100 points);
--   notify   one member_notice row per paid order, unless the user's
--            account is on hold (member_hold): then the group answers
--            "retry" until the hold is lifted, and after N deliveries the
--            event lands in dead_letter (txc-events redeliver, once fixed);
--   tickets  qty issued_ticket rows per paid order, seq 1..qty.
-- Applied with the sets `consumer events`: consumed_event and dead_letter
-- (sql/consumer/) make each effect happen once per (consumer_group,
-- biz_key), in the same local transaction as the effect; the keys below
-- (one row per order, one ticket per order and seq) say the same thing a
-- second time, in the tables a reader looks at.
-- Nothing here refers to the orders database: a consumer knows only what
-- the event carries (order_id and its payload).
--
-- Never edit this file after it has shipped: add sql/events/002_*.sql instead.

CREATE TABLE points_ledger (
  order_id    bigint      NOT NULL,
  user_id     bigint      NOT NULL,
  activity_id bigint      NOT NULL,
  points      integer     NOT NULL,
  event_id    bigint      NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT points_ledger_pkey PRIMARY KEY (order_id),
  CONSTRAINT points_ledger_points_check CHECK (points > 0)
);

-- A member's balance: sum(points) by user.
CREATE INDEX points_ledger_user_idx ON points_ledger (user_id);

CREATE TABLE member_notice (
  order_id    bigint      NOT NULL,
  user_id     bigint      NOT NULL,
  activity_id bigint      NOT NULL,
  kind        text        NOT NULL,
  text        text        NOT NULL,
  event_id    bigint      NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT member_notice_pkey PRIMARY KEY (order_id),
  CONSTRAINT member_notice_kind_check CHECK (kind IN ('paid'))
);

CREATE INDEX member_notice_user_idx ON member_notice (user_id);

CREATE TABLE issued_ticket (
  order_id    bigint      NOT NULL,
  seq         integer     NOT NULL,
  ticket_code text        NOT NULL,
  user_id     bigint      NOT NULL,
  activity_id bigint      NOT NULL,
  ticket_type integer     NOT NULL,
  event_id    bigint      NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT issued_ticket_pkey PRIMARY KEY (order_id, seq),
  CONSTRAINT issued_ticket_code_key UNIQUE (ticket_code),
  CONSTRAINT issued_ticket_seq_check CHECK (seq >= 1)
);

CREATE TABLE member_hold (
  user_id    bigint      NOT NULL,
  reason     text        NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT member_hold_pkey PRIMARY KEY (user_id)
);

-- The checker's (fs_check consumers_once) scan: an activity's effects.
CREATE INDEX points_ledger_activity_idx ON points_ledger (activity_id);
CREATE INDEX member_notice_activity_idx ON member_notice (activity_id);
CREATE INDEX issued_ticket_activity_idx ON issued_ticket (activity_id);

COMMENT ON TABLE points_ledger IS
  'Loyalty points credited for a paid order (consumer group "points"): one row per order.';
COMMENT ON COLUMN points_ledger.order_id IS 'The paid order (the event''s order_id).';
COMMENT ON COLUMN points_ledger.user_id IS 'The member credited (the event''s payload user).';
COMMENT ON COLUMN points_ledger.activity_id IS 'The sale the order belongs to (payload activity).';
COMMENT ON COLUMN points_ledger.points IS 'Points credited: 100 per ticket.';
COMMENT ON COLUMN points_ledger.event_id IS 'order_outbox.event_id of the order.paid event applied.';
COMMENT ON COLUMN points_ledger.created_at IS 'When the credit committed.';

COMMENT ON TABLE member_notice IS
  'Notices to members about their orders (consumer group "notify"): one row per order; '
  'a user on hold (member_hold) gets none until the hold is lifted.';
COMMENT ON COLUMN member_notice.order_id IS 'The order the notice is about.';
COMMENT ON COLUMN member_notice.user_id IS 'The member notified.';
COMMENT ON COLUMN member_notice.activity_id IS 'The sale the order belongs to.';
COMMENT ON COLUMN member_notice.kind IS 'What happened: paid (the only kind so far).';
COMMENT ON COLUMN member_notice.text IS 'The message, as it would be sent.';
COMMENT ON COLUMN member_notice.event_id IS 'order_outbox.event_id of the event applied.';
COMMENT ON COLUMN member_notice.created_at IS 'When the notice committed.';

COMMENT ON TABLE issued_ticket IS
  'Tickets issued for a paid order (consumer group "tickets"): qty rows, seq 1..qty.';
COMMENT ON COLUMN issued_ticket.order_id IS 'The paid order.';
COMMENT ON COLUMN issued_ticket.seq IS 'The ticket''s number within its order, 1..qty.';
COMMENT ON COLUMN issued_ticket.ticket_code IS
  'What the holder shows at the door: TK<activity>-<order>-<seq>-<6 hex of a digest>, '
  'the same whenever the event is applied.';
COMMENT ON COLUMN issued_ticket.user_id IS 'The holder (payload user).';
COMMENT ON COLUMN issued_ticket.activity_id IS 'The sale (payload activity).';
COMMENT ON COLUMN issued_ticket.ticket_type IS 'The ticket type (payload ticket_type).';
COMMENT ON COLUMN issued_ticket.event_id IS 'order_outbox.event_id of the order.paid event applied.';
COMMENT ON COLUMN issued_ticket.created_at IS 'When the ticket was issued.';

COMMENT ON TABLE member_hold IS
  'Members whose account is on hold: the "notify" group refuses their events (retry, '
  'then dead letter) until the row is deleted; then an operator redelivers them.';
COMMENT ON COLUMN member_hold.user_id IS 'The member on hold.';
COMMENT ON COLUMN member_hold.reason IS 'Why, shown in the retries and the dead letter.';
COMMENT ON COLUMN member_hold.created_at IS 'Since when.';
