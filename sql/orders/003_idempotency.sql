-- sql/orders/003_idempotency.sql - idempotent submit: the order remembers
-- the client's Idempotency-Key (orders database, version 3).
--
-- POST /orders may carry an Idempotency-Key header; the same key from the
-- same user must never make a second order (examples/order_service.c).
-- Redis holds the fast path (the stored answer); this is the truth: the key
-- is written in the very statement that creates the order (the AT insert of
-- a global transaction, or order_local_insert in fallback-to-local mode),
-- and the unique key below refuses a second order for (user_id, idem_key).
-- A global transaction that rolls back deletes its order with its undo, and
-- so frees the key: correct, that order did not happen.  Orders without a
-- key (NULL) never conflict.
--
-- Never edit this file after it has shipped: add sql/orders/004_*.sql instead.

ALTER TABLE trade_order ADD COLUMN idem_key text;

ALTER TABLE trade_order
  ADD CONSTRAINT trade_order_idem_key_check
    CHECK (idem_key IS NULL OR idem_key ~ '^[A-Za-z0-9._:-]{1,64}$'),
  ADD CONSTRAINT trade_order_user_idem_key UNIQUE (user_id, idem_key);

COMMENT ON COLUMN trade_order.idem_key IS
  'The Idempotency-Key the client sent with POST /orders (1 to 64 bytes of '
  '[A-Za-z0-9._:-]); unique per user (trade_order_user_idem_key), so a '
  'retried request finds this order instead of making a second one. NULL '
  'when the request had none (and for waitlist orders).';

-- order_local_insert, version 2: the same, with the order's idempotency key
-- (p_idem_key, NULL = none).  The 8-argument form of 002 goes: calls with 8
-- arguments reach this one through the default, and two candidates would
-- make them ambiguous.  Returns 0 (inserted), 1 (this very order was
-- inserted before: nothing done, a retry), -4 (the order id exists with
-- other values, or as an order of a global transaction: nothing done) or
-- -9 (another order of this user holds p_idem_key: nothing done; the
-- caller answers with that order).
DROP FUNCTION order_local_insert(bigint, bigint, integer, bigint, integer, integer, timestamptz, timestamptz);

CREATE FUNCTION order_local_insert(p_order_id bigint, p_activity_id bigint, p_ticket_type integer,
                                   p_user_id bigint, p_qty integer, p_bucket_id integer,
                                   p_expire_at timestamptz, p_freeze_deadline timestamptz,
                                   p_idem_key text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  r order_compensation%ROWTYPE;
  k text;
BEGIN
  SELECT idem_key INTO k FROM trade_order WHERE order_id = p_order_id;
  IF FOUND THEN
    SELECT * INTO r FROM order_compensation WHERE order_id = p_order_id;
    IF FOUND AND r.activity_id = p_activity_id AND r.ticket_type = p_ticket_type
       AND r.user_id = p_user_id AND r.qty = p_qty AND r.bucket_id = p_bucket_id
       AND k IS NOT DISTINCT FROM p_idem_key THEN
      RETURN 1;
    END IF;
    RETURN -4;
  END IF;
  -- A concurrent insert of the same key waits here for the other
  -- transaction, then does nothing if it committed.
  INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, expire_at, idem_key)
  VALUES (p_order_id, p_activity_id, p_ticket_type, p_user_id, p_qty, p_bucket_id,
          coalesce(p_expire_at, now() + interval '15 minutes'), p_idem_key)
  ON CONFLICT ON CONSTRAINT trade_order_user_idem_key DO NOTHING;
  IF NOT FOUND THEN
    RETURN -9;
  END IF;
  INSERT INTO order_compensation (order_id, activity_id, ticket_type, bucket_id, user_id, qty,
                                  freeze_deadline)
  VALUES (p_order_id, p_activity_id, p_ticket_type, p_bucket_id, p_user_id, p_qty,
          coalesce(p_freeze_deadline, p_expire_at, now() + interval '15 minutes'));
  RETURN 0;
END
$$;

COMMENT ON FUNCTION order_local_insert(bigint, bigint, integer, bigint, integer, integer, timestamptz, timestamptz, text) IS
  'Local-mode order: trade_order row (with its idempotency key) + compensation row. '
  '0 done, 1 done before, -4 other values, -9 key held by another order.';
