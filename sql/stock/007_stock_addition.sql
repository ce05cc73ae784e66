-- 007_stock_addition.sql - more tickets later: an organiser adds stock to a
-- running sale (stock database, version 7).
--
-- stock_add(activity, ticket type, qty, key, by) spreads qty over the
-- ticket type's buckets (qty / n each, the first qty % n one more) and
-- records the addition under (activity, key) in the same transaction, so
-- that a retry after a lost answer (same key) adds nothing twice: it gets
-- the addition recorded before.  It returns one row per bucket of the
-- ticket type with the result code and the bucket's stock after the
-- addition; the caller (stock-service, POST /tickets) hands those stocks
-- to the Redis prefilter, which raises its copy to them (stock only ever
-- grows, so raising to PostgreSQL's value is idempotent and order-free:
-- lua/stock_add.lua).
--   result  0  added now
--           1  done before with the same ticket type and qty (a repeat)
--          -2  the key was used for another ticket type or qty: nothing
--          -3  the ticket type has no buckets: nothing
--          -4  no such activity, or the sale has ended (status 2, or
--              past ends_at): nothing
-- (-2 .. -4 come as one row with bucket_id and stock NULL.)
--
-- The buckets are updated in bucket order, so two additions never
-- deadlock; a freeze holds one bucket row at a time.  Bucket rows are
-- changed in place by a local transaction: in AT image mode
-- (STOCK_FREEZE_MODE=at) a global rollback would put a bucket's before
-- image back, stock included, so stock-service refuses additions there.
--
-- Never edit this file after it has shipped: add sql/stock/008_*.sql instead.

CREATE TABLE stock_addition (
  activity_id bigint      NOT NULL,
  add_key     text        NOT NULL,
  ticket_type integer     NOT NULL,
  qty         integer     NOT NULL,
  added_by    text,
  created_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT stock_addition_pkey PRIMARY KEY (activity_id, add_key),
  CONSTRAINT stock_addition_activity_fkey FOREIGN KEY (activity_id) REFERENCES activity (activity_id),
  CONSTRAINT stock_addition_key_check CHECK (add_key ~ '^[A-Za-z0-9._:-]{1,64}$'),
  CONSTRAINT stock_addition_qty_check CHECK (qty BETWEEN 1 AND 1000000)
);

COMMENT ON TABLE stock_addition IS
  'Tickets added to an activity after seeding (stock_add), one row per addition: the record that '
  'makes a repeated addition (same key) add nothing, and what the daily reconciliation can count.';
COMMENT ON COLUMN stock_addition.activity_id IS 'activity.activity_id.';
COMMENT ON COLUMN stock_addition.ticket_type IS 'activity_ticket_bucket.ticket_type the tickets were added to.';
COMMENT ON COLUMN stock_addition.created_at IS 'When the addition committed.';
COMMENT ON COLUMN stock_addition.add_key IS 'The caller''s name for this addition (its idempotency key).';
COMMENT ON COLUMN stock_addition.qty IS 'Tickets added, spread over the ticket type''s buckets.';
COMMENT ON COLUMN stock_addition.added_by IS 'Who asked (the admin call''s operator), for the audit.';
COMMENT ON COLUMN activity_ticket_bucket.stock IS
  'Tickets in this bucket: seeded, then grown by stock_add (never lowered).';

CREATE FUNCTION stock_add(p_activity_id bigint, p_ticket_type integer, p_qty integer, p_key text,
                          p_by text DEFAULT NULL)
RETURNS TABLE (result integer, bucket_id integer, stock integer)
LANGUAGE plpgsql AS $$
DECLARE
  a activity%ROWTYPE;
  prev stock_addition%ROWTYPE;
  n integer;
  code integer := 0;
BEGIN
  IF p_qty IS NULL OR p_qty < 1 OR p_qty > 1000000 OR p_key IS NULL
     OR p_key !~ '^[A-Za-z0-9._:-]{1,64}$' THEN
    RAISE EXCEPTION 'stock_add: qty must be 1 .. 1000000 and the key 1 to 64 of A-Za-z0-9._:-'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO a FROM activity WHERE activity_id = p_activity_id;
  IF NOT FOUND OR a.status = 2 OR clock_timestamp() >= a.ends_at THEN
    RETURN QUERY SELECT -4, NULL::integer, NULL::integer;
    RETURN;
  END IF;
  INSERT INTO stock_addition (activity_id, add_key, ticket_type, qty, added_by)
    VALUES (p_activity_id, p_key, p_ticket_type, p_qty, p_by)
    ON CONFLICT ON CONSTRAINT stock_addition_pkey DO NOTHING;
  IF NOT FOUND THEN
    SELECT * INTO prev FROM stock_addition s WHERE s.activity_id = p_activity_id AND s.add_key = p_key;
    IF prev.ticket_type <> p_ticket_type OR prev.qty <> p_qty THEN
      RETURN QUERY SELECT -2, NULL::integer, NULL::integer;
      RETURN;
    END IF;
    code := 1;
  ELSE
    SELECT count(*) INTO n FROM activity_ticket_bucket b
     WHERE b.activity_id = p_activity_id AND b.ticket_type = p_ticket_type;
    IF n = 0 THEN
      DELETE FROM stock_addition s WHERE s.activity_id = p_activity_id AND s.add_key = p_key;
      RETURN QUERY SELECT -3, NULL::integer, NULL::integer;
      RETURN;
    END IF;
    -- one UPDATE, rows locked in bucket order (ORDER BY in the locking
    -- subquery), each bucket its share
    UPDATE activity_ticket_bucket b
       SET stock = b.stock + s.share
      FROM (SELECT x.bucket_id,
                   p_qty / n + CASE WHEN row_number() OVER (ORDER BY x.bucket_id) <= p_qty % n THEN 1 ELSE 0 END
                     AS share
              FROM (SELECT y.bucket_id FROM activity_ticket_bucket y
                     WHERE y.activity_id = p_activity_id AND y.ticket_type = p_ticket_type
                     ORDER BY y.bucket_id FOR UPDATE) x) s
     WHERE b.activity_id = p_activity_id AND b.ticket_type = p_ticket_type AND b.bucket_id = s.bucket_id;
  END IF;
  RETURN QUERY SELECT code, b.bucket_id, b.stock FROM activity_ticket_bucket b
                WHERE b.activity_id = p_activity_id AND b.ticket_type = p_ticket_type
                ORDER BY b.bucket_id;
END
$$;

COMMENT ON FUNCTION stock_add(bigint, integer, integer, text, text) IS
  'Add p_qty tickets of a ticket type to a running (or coming) sale, spread over its buckets, once per '
  'key: one row per bucket (result 0 added, 1 done before) with its stock after, or one row with '
  '-2 key reused, -3 no buckets, -4 no such activity or the sale ended.';
