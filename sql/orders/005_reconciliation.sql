-- sql/orders/005_reconciliation.sql - daily reconciliation (issue 24): the
-- order's amount, the payment ledger, and what the reconciliation job
-- found (orders database, version 5).
--
-- The demo has no payment provider: POST /orders/{id}/pay writes one
-- payment_ledger row in the same local transaction that moves the order
-- to PAID, as the stand-in for the provider's statement.  The
-- reconciliation job (examples/reconcile.c: build/bin/txc-reconcile and
-- order-service's schedule) compares, for a window, the orders with this
-- ledger, with the stock database (stock_freeze, activity_ticket_bucket)
-- and with the events database (points_ledger), and records each run in
-- reconcile_run and each difference it found in reconcile_difference.
--
-- Never edit this file after it has shipped: add sql/orders/006_*.sql instead.

ALTER TABLE trade_order ADD COLUMN amount_cents bigint;
ALTER TABLE trade_order ADD CONSTRAINT trade_order_amount_check
  CHECK (amount_cents IS NULL OR amount_cents >= 0);

COMMENT ON COLUMN trade_order.amount_cents IS
  'What the order costs, in cents: qty times the ticket price order-service '
  'is configured with (ORDER_TICKET_PRICE_CENTS), set when the order is made '
  '(a local-mode order, and one made before version 5: when it is paid); '
  'NULL for an order made before version 5 and never paid.';

-- The job's scan of the orders paid in a window.  Partial: the purchase's
-- insert (UNPAID) does not touch it.
CREATE INDEX trade_order_paid_updated_idx ON trade_order (updated_at) WHERE status = 'PAID';

CREATE TABLE payment_ledger (
  order_id     bigint      NOT NULL,
  amount_cents bigint      NOT NULL,
  provider_ref text        NOT NULL,
  paid_at      timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT payment_ledger_pkey PRIMARY KEY (order_id),
  CONSTRAINT payment_ledger_amount_check CHECK (amount_cents >= 0),
  CONSTRAINT payment_ledger_ref_len CHECK (octet_length(provider_ref) BETWEEN 1 AND 128)
);

CREATE INDEX payment_ledger_paid_at_idx ON payment_ledger (paid_at);

COMMENT ON TABLE payment_ledger IS
  'The payment provider''s statement (the demo''s stand-in): one row per paid '
  'order, written by POST /orders/{id}/pay in the transaction that makes the '
  'order PAID.  No foreign key to trade_order on purpose: a statement may '
  'name an order we do not have, which the reconciliation reports.';
COMMENT ON COLUMN payment_ledger.order_id IS 'The order paid (trade_order.order_id, as the provider knows it).';
COMMENT ON COLUMN payment_ledger.amount_cents IS 'Amount the provider took, in cents.';
COMMENT ON COLUMN payment_ledger.provider_ref IS 'The provider''s reference of the payment (demo: "demo-pay:<order_id>").';
COMMENT ON COLUMN payment_ledger.paid_at IS 'When the payment was taken.';

CREATE TABLE reconcile_run (
  run_id        bigint      GENERATED ALWAYS AS IDENTITY,
  started_by    text        NOT NULL,
  window_start  timestamptz NOT NULL,
  window_end    timestamptz NOT NULL,
  state         text        NOT NULL DEFAULT 'RUNNING',
  differences   integer,
  counts        jsonb,
  error         text,
  started_at    timestamptz NOT NULL DEFAULT now(),
  finished_at   timestamptz,
  CONSTRAINT reconcile_run_pkey PRIMARY KEY (run_id),
  CONSTRAINT reconcile_run_started_by_check CHECK (started_by IN ('tool', 'schedule')),
  CONSTRAINT reconcile_run_window_check CHECK (window_end >= window_start),
  CONSTRAINT reconcile_run_state_check CHECK (
    (state = 'RUNNING' AND finished_at IS NULL)
    OR (state = 'DONE' AND finished_at IS NOT NULL AND differences IS NOT NULL)
    OR (state = 'FAILED' AND finished_at IS NOT NULL AND error IS NOT NULL))
);

-- The schedule's question "did an instance run it already?".
CREATE INDEX reconcile_run_started_by_idx ON reconcile_run (started_by, started_at);

COMMENT ON TABLE reconcile_run IS
  'One run of the reconciliation job (txc-reconcile, or order-service''s '
  'schedule): the window it compared and how it ended.';
COMMENT ON COLUMN reconcile_run.run_id IS 'Run id (reconcile_difference.run_id).';
COMMENT ON COLUMN reconcile_run.started_by IS 'tool (txc-reconcile) or schedule (order-service).';
COMMENT ON COLUMN reconcile_run.window_start IS 'Start of the window compared (inclusive).';
COMMENT ON COLUMN reconcile_run.window_end IS
  'End of the window (exclusive): at most the run''s start minus the settle '
  'margin, so that events still on their way are left for the next run.';
COMMENT ON COLUMN reconcile_run.state IS 'RUNNING, DONE (differences counted) or FAILED (error set).';
COMMENT ON COLUMN reconcile_run.differences IS 'Differences found (rows in reconcile_difference); NULL unless DONE.';
COMMENT ON COLUMN reconcile_run.counts IS
  'What was compared: {"paid_orders", "ledger_entries", "confirmed_freezes", '
  '"buckets", "points_rows"}; points_rows is null when the events database '
  'was not compared.';
COMMENT ON COLUMN reconcile_run.error IS 'Why the run failed.';
COMMENT ON COLUMN reconcile_run.started_at IS 'When the run started.';
COMMENT ON COLUMN reconcile_run.finished_at IS 'When it ended.';

CREATE TABLE reconcile_difference (
  difference_id bigint      GENERATED ALWAYS AS IDENTITY,
  run_id        bigint      NOT NULL,
  check_name    text        NOT NULL,
  kind          text        NOT NULL,
  reason        text        NOT NULL,
  order_id      bigint,
  activity_id   bigint,
  ticket_type   integer,
  bucket_id     integer,
  expected      text,
  actual        text,
  CONSTRAINT reconcile_difference_pkey PRIMARY KEY (difference_id),
  CONSTRAINT reconcile_difference_run_fkey FOREIGN KEY (run_id)
    REFERENCES reconcile_run (run_id) ON DELETE CASCADE,
  CONSTRAINT reconcile_difference_check_name_check CHECK (check_name IN ('payment', 'stock', 'points'))
);

CREATE INDEX reconcile_difference_run_idx ON reconcile_difference (run_id);
CREATE INDEX reconcile_difference_order_idx ON reconcile_difference (order_id) WHERE order_id IS NOT NULL;

COMMENT ON TABLE reconcile_difference IS
  'A difference a reconciliation run found: which comparison (check_name), '
  'what is wrong (kind, one of examples/reconcile.h), the sentence an '
  'operator reads (reason), the ids concerned, and the value expected '
  'against the value found.';
COMMENT ON COLUMN reconcile_difference.difference_id IS 'Row id.';
COMMENT ON COLUMN reconcile_difference.run_id IS 'The run (reconcile_run.run_id).';
COMMENT ON COLUMN reconcile_difference.check_name IS
  'payment (order against payment ledger), stock (paid tickets against the '
  'stock database) or points (points against paid orders).';
COMMENT ON COLUMN reconcile_difference.kind IS
  'paid_without_ledger, ledger_without_order, ledger_order_not_paid, '
  'amount_mismatch; paid_not_confirmed, confirmed_not_paid, '
  'sold_count_mismatch; paid_without_points, points_not_paid, points_mismatch.';
COMMENT ON COLUMN reconcile_difference.reason IS 'What is wrong, in a sentence.';
COMMENT ON COLUMN reconcile_difference.order_id IS 'The order concerned; NULL for a bucket''s difference.';
COMMENT ON COLUMN reconcile_difference.activity_id IS 'Activity, when known.';
COMMENT ON COLUMN reconcile_difference.ticket_type IS 'Ticket type, when known.';
COMMENT ON COLUMN reconcile_difference.bucket_id IS 'Stock bucket, when known.';
COMMENT ON COLUMN reconcile_difference.expected IS
  'What the other side says it should be (e.g. the order''s amount, the sum '
  'of confirmed freezes, "PAID", "present"); NULL when nothing is expected.';
COMMENT ON COLUMN reconcile_difference.actual IS 'What was found ("missing" when the row is absent).';
