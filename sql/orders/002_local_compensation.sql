-- sql/orders/002_local_compensation.sql - fallback-to-local mode: the
-- orders database's compensation log (orders database, version 2).
--
-- When no coordinator answers, librmclient's local mode (rm_local_*, see
-- rm-client/include/rm_client.h) takes orders without a global
-- transaction: the Redis prefilter is the stock gate, the order is
-- inserted in a plain local transaction together with one row here (what
-- was done, keyed by order id, with the Redis bucket), and the stock
-- database records its side through its own compensation row
-- (sql/stock/003_stock_compensation.sql).  The compensation job
-- (rm_compensate_run) later walks the PENDING rows here and makes the two
-- databases and Redis agree: the stock side frozen (the order stands) or
-- refused (the order is cancelled with a reason the user sees, and the
-- Redis freeze released); then the row becomes DONE.
--
-- Every step is idempotent and the decision is taken once, in the stock
-- database (stock_compensation's primary key), so the job may be killed at
-- any point and run again.  One job at a time: it holds a session advisory
-- lock on this database while it runs.
--
-- Never edit this file after it has shipped: add sql/orders/003_*.sql instead.

ALTER TABLE trade_order ADD COLUMN cancel_reason text;

COMMENT ON COLUMN trade_order.cancel_reason IS
  'Why the order was cancelled, for the user (set when the system cancelled '
  'it, e.g. an order taken while the coordinator was unreachable that the '
  'stock could not honour); NULL otherwise.';

CREATE TABLE order_compensation (
  order_id        bigint      NOT NULL,
  activity_id     bigint      NOT NULL,
  ticket_type     integer     NOT NULL,
  bucket_id       integer     NOT NULL,
  user_id         bigint      NOT NULL,
  qty             integer     NOT NULL,
  freeze_deadline timestamptz NOT NULL,
  state           text        NOT NULL DEFAULT 'PENDING',
  outcome         text,
  reason          text,
  attempts        integer     NOT NULL DEFAULT 0,
  last_error      text,
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now(),
  done_at         timestamptz,
  CONSTRAINT order_compensation_pkey PRIMARY KEY (order_id),
  CONSTRAINT order_compensation_order_fkey FOREIGN KEY (order_id)
    REFERENCES trade_order (order_id),
  CONSTRAINT order_compensation_qty_check CHECK (qty BETWEEN 1 AND 10000),
  CONSTRAINT order_compensation_bucket_check CHECK (bucket_id >= 0),
  CONSTRAINT order_compensation_state_check CHECK (state IN ('PENDING', 'DONE')),
  CONSTRAINT order_compensation_outcome_check CHECK (
    (state = 'PENDING' AND outcome IS NULL AND done_at IS NULL)
    OR (state = 'DONE' AND outcome IN ('FROZEN', 'CANCELLED') AND done_at IS NOT NULL))
);

-- The job's scan: pending rows in order id order.
CREATE INDEX order_compensation_pending_idx ON order_compensation (order_id)
  WHERE state = 'PENDING';

COMMENT ON TABLE order_compensation IS
  'One row per order taken in fallback-to-local mode (no global '
  'transaction), written in the same local transaction as the order: the '
  'work the compensation job must finish or undo.';
COMMENT ON COLUMN order_compensation.order_id IS 'trade_order.order_id (and the Redis freeze''s order id).';
COMMENT ON COLUMN order_compensation.activity_id IS 'Activity (stock database).';
COMMENT ON COLUMN order_compensation.ticket_type IS 'Ticket type.';
COMMENT ON COLUMN order_compensation.bucket_id IS 'Bucket the Redis prefilter froze the tickets in.';
COMMENT ON COLUMN order_compensation.user_id IS 'Buyer.';
COMMENT ON COLUMN order_compensation.qty IS 'Tickets.';
COMMENT ON COLUMN order_compensation.freeze_deadline IS
  'Deadline of the stock freeze (stock_freeze.deadline) when the job records it.';
COMMENT ON COLUMN order_compensation.state IS
  'PENDING (the stock side may lack the freeze) or DONE (both databases agree).';
COMMENT ON COLUMN order_compensation.outcome IS
  'FROZEN (the stock honoured the order) or CANCELLED (it could not: the '
  'order was cancelled and its Redis freeze released); NULL while pending.';
COMMENT ON COLUMN order_compensation.reason IS
  'Why it was cancelled: sold_out, over_limit or invalid (the stock database''s refusal).';
COMMENT ON COLUMN order_compensation.attempts IS 'Failed attempts of the job on this row.';
COMMENT ON COLUMN order_compensation.last_error IS 'The last failure''s message.';
COMMENT ON COLUMN order_compensation.created_at IS 'When the order was taken.';
COMMENT ON COLUMN order_compensation.updated_at IS 'Last change of the row.';
COMMENT ON COLUMN order_compensation.done_at IS 'When it became DONE.';

-- order_local_insert: take an order in local mode, in the caller's
-- transaction: the trade_order row (UNPAID, no xid) and its compensation
-- row.  Returns 0 (inserted), 1 (this very order was inserted before:
-- nothing done, a retry) or -4 (the order id exists with other values, or
-- as an order of a global transaction: nothing done).
CREATE FUNCTION order_local_insert(p_order_id bigint, p_activity_id bigint, p_ticket_type integer,
                                   p_user_id bigint, p_qty integer, p_bucket_id integer,
                                   p_expire_at timestamptz, p_freeze_deadline timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  r order_compensation%ROWTYPE;
BEGIN
  PERFORM 1 FROM trade_order WHERE order_id = p_order_id;
  IF FOUND THEN
    SELECT * INTO r FROM order_compensation WHERE order_id = p_order_id;
    IF FOUND AND r.activity_id = p_activity_id AND r.ticket_type = p_ticket_type
       AND r.user_id = p_user_id AND r.qty = p_qty AND r.bucket_id = p_bucket_id THEN
      RETURN 1;
    END IF;
    RETURN -4;
  END IF;
  INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, expire_at)
  VALUES (p_order_id, p_activity_id, p_ticket_type, p_user_id, p_qty, p_bucket_id,
          coalesce(p_expire_at, now() + interval '15 minutes'));
  INSERT INTO order_compensation (order_id, activity_id, ticket_type, bucket_id, user_id, qty,
                                  freeze_deadline)
  VALUES (p_order_id, p_activity_id, p_ticket_type, p_bucket_id, p_user_id, p_qty,
          coalesce(p_freeze_deadline, p_expire_at, now() + interval '15 minutes'));
  RETURN 0;
END
$$;

COMMENT ON FUNCTION order_local_insert(bigint, bigint, integer, bigint, integer, integer, timestamptz, timestamptz) IS
  'Local-mode order: trade_order row + compensation row. 0 done, 1 done before, -4 other values.';

-- order_local_finish: the stock side decided.  p_outcome 'FROZEN': the
-- order stands; 'CANCELLED': the order goes from UNPAID to CANCELLED with
-- p_user_reason (an order already CANCELLED or EXPIRED stays as it is).
-- Either way the compensation row becomes DONE.  Returns 0 (done now), 1
-- (done before with the same outcome), -5 (done before with the other
-- outcome: nothing changed), -6 (cancel asked but the order is PAID:
-- nothing changed; an operator must look), -8 (no compensation row).
CREATE FUNCTION order_local_finish(p_order_id bigint, p_outcome text, p_reason text,
                                   p_user_reason text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  r order_compensation%ROWTYPE;
  st text;
BEGIN
  SELECT * INTO r FROM order_compensation WHERE order_id = p_order_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN -8;
  END IF;
  IF r.state = 'DONE' THEN
    RETURN CASE WHEN r.outcome = p_outcome THEN 1 ELSE -5 END;
  END IF;
  IF p_outcome = 'CANCELLED' THEN
    SELECT status INTO st FROM trade_order WHERE order_id = p_order_id FOR UPDATE;
    IF st = 'PAID' THEN
      RETURN -6;
    END IF;
    UPDATE trade_order
       SET status = 'CANCELLED', cancel_reason = p_user_reason, updated_at = now()
     WHERE order_id = p_order_id AND status = 'UNPAID';
  END IF;
  UPDATE order_compensation
     SET state = 'DONE', outcome = p_outcome, reason = p_reason, done_at = now(), updated_at = now()
   WHERE order_id = p_order_id;
  RETURN 0;
END
$$;

COMMENT ON FUNCTION order_local_finish(bigint, text, text, text) IS
  'Finish a local-mode order: FROZEN (stands) or CANCELLED (with the user''s reason). '
  '0 done, 1 done before, -5 other outcome before, -6 paid, -8 unknown.';
