-- sql/stock/003_stock_compensation.sql - fallback-to-local mode: the stock
-- database's compensation record (stock database, version 3).
--
-- In local mode (no coordinator: librmclient rm_local_*, see
-- sql/orders/002_local_compensation.sql) the stock side of an order is
-- never a blind write: stock_local_freeze records, in one local
-- transaction, this table's row for the order and the freeze itself
-- (stock_freeze_apply: the guarded bucket update, stock_freeze and
-- stock_log rows).  The row's primary key makes the decision once per
-- order, whoever asks first (stock-service on the order's way in, or the
-- compensation job later): FROZEN (the stock honoured the order) or
-- REFUSED (it could not: sold out, over the user's limit, invalid).  A
-- second caller waits for the first's transaction, then reads its
-- decision, so the two can never decide differently, and a repeated call
-- changes nothing.
--
-- Never edit this file after it has shipped: add sql/stock/004_*.sql instead.

CREATE TABLE stock_compensation (
  order_id    bigint      NOT NULL,
  activity_id bigint      NOT NULL,
  ticket_type integer     NOT NULL,
  bucket_id   integer     NOT NULL,
  user_id     bigint      NOT NULL,
  qty         integer     NOT NULL,
  state       text        NOT NULL,
  refusal     integer,
  source      text        NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT stock_compensation_pkey PRIMARY KEY (order_id),
  CONSTRAINT stock_compensation_state_check CHECK (
    (state = 'FROZEN' AND refusal IS NULL)
    OR (state = 'REFUSED' AND refusal IN (-2, -3, -4))),
  CONSTRAINT stock_compensation_source_check CHECK (source IN ('service', 'compensation'))
);

COMMENT ON TABLE stock_compensation IS
  'One row per order whose stock was handled in fallback-to-local mode: the '
  'decision (FROZEN or REFUSED), taken once, in the same local transaction '
  'as the freeze.';
COMMENT ON COLUMN stock_compensation.order_id IS 'trade_order.order_id (orders database).';
COMMENT ON COLUMN stock_compensation.activity_id IS 'activity.activity_id.';
COMMENT ON COLUMN stock_compensation.ticket_type IS 'Ticket type.';
COMMENT ON COLUMN stock_compensation.bucket_id IS 'Bucket (the one Redis froze in).';
COMMENT ON COLUMN stock_compensation.user_id IS 'Buyer.';
COMMENT ON COLUMN stock_compensation.qty IS 'Tickets.';
COMMENT ON COLUMN stock_compensation.state IS
  'FROZEN (stock_freeze has the freeze) or REFUSED (nothing was frozen).';
COMMENT ON COLUMN stock_compensation.refusal IS
  'REFUSED rows: stock_freeze_apply''s code, -2 over the user limit, -3 sold '
  'out, -4 invalid (no such bucket, or the order id recorded with other values).';
COMMENT ON COLUMN stock_compensation.source IS
  'Who decided: service (stock-service, on the order''s way in) or compensation (the job).';
COMMENT ON COLUMN stock_compensation.created_at IS 'When it was decided.';

-- stock_local_freeze: the stock side of a local-mode order, once.  Returns
-- 0 (frozen now), 1 (frozen before: by an earlier call, or a freeze of
-- this order already in stock_freeze), -2 / -3 / -4 (refused, now or
-- before: over the limit, sold out, invalid), -9 (the order was recorded
-- here with other values: nothing done).  Runs in the caller's
-- transaction; the compensation row is inserted first, so that its key
-- serializes concurrent callers of one order before anything else.
CREATE FUNCTION stock_local_freeze(p_order_id bigint, p_activity_id bigint, p_ticket_type integer,
                                   p_bucket_id integer, p_user_id bigint, p_qty integer,
                                   p_deadline timestamptz, p_source text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  r stock_compensation%ROWTYPE;
  n integer;
  code integer;
BEGIN
  INSERT INTO stock_compensation (order_id, activity_id, ticket_type, bucket_id, user_id, qty,
                                  state, source)
  VALUES (p_order_id, p_activity_id, p_ticket_type, p_bucket_id, p_user_id, p_qty,
          'FROZEN', p_source)
  ON CONFLICT (order_id) DO NOTHING;
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n = 0 THEN
    SELECT * INTO r FROM stock_compensation WHERE order_id = p_order_id;
    IF r.activity_id <> p_activity_id OR r.ticket_type <> p_ticket_type
       OR r.bucket_id <> p_bucket_id OR r.user_id <> p_user_id OR r.qty <> p_qty THEN
      RETURN -9;
    END IF;
    RETURN CASE r.state WHEN 'FROZEN' THEN 1 ELSE r.refusal END;
  END IF;
  code := stock_freeze_apply(p_order_id, p_activity_id, p_ticket_type, p_bucket_id, p_user_id,
                             p_qty, p_deadline, NULL);
  IF code = 0 THEN
    RETURN 0;
  END IF;
  IF code IN (1, -6, -7) THEN
    RETURN 1; -- the order's freeze was recorded before (and may have ended since)
  END IF;
  IF code NOT IN (-2, -3, -4) THEN
    RAISE EXCEPTION 'stock_freeze_apply returned unexpected code %', code;
  END IF;
  UPDATE stock_compensation SET state = 'REFUSED', refusal = code WHERE order_id = p_order_id;
  RETURN code;
END
$$;

COMMENT ON FUNCTION stock_local_freeze(bigint, bigint, integer, integer, bigint, integer, timestamptz, text) IS
  'Stock side of a local-mode order, decided once: 0 frozen, 1 frozen before, '
  '-2 over limit, -3 sold out, -4 invalid, -9 recorded with other values.';
