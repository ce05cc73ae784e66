-- 008_freeze_finish_many.sql - the ends of many orders' freezes in one
-- statement (stock database, version 8).
--
-- stock-service's consumer of the order events (group "stock") confirms a
-- paid order's freeze and releases a cancelled or expired one's.  It used
-- to call stock_freeze_finish once per event, each in a transaction of its
-- own, so each payment took the hot bucket row's lock once and paid a
-- durable commit.  stock_freeze_finish_many does what n calls of
-- stock_freeze_finish would, for the events of one read:
--
--   * the orders' FROZEN rows are locked in order_id order and moved to
--     CONFIRMED (reason NULL) or RELEASED (reason 'cancel' / 'expire');
--   * the quantities are summed per bucket and each bucket is updated
--     once, in (activity, ticket type, bucket) order: frozen_count less
--     the sum, sold_count more the confirmed part.  A freeze holds one
--     bucket and an expiry sweep takes them in ascending order, so none
--     of them waits for another in a cycle.  The bucket updates come
--     last, so their row locks are held for the commit only, as with
--     one event;
--   * one stock_log row per order, as stock_freeze_finish writes.
--
-- It returns one row per order, in the order given, with the code
-- stock_freeze_finish would have returned: 0 done now, -6 confirmed
-- before, -7 released before, -8 no such freeze.  An order given twice is
-- an error (nothing changes): the caller applies such events one by one.
--
-- Never edit this file after it has shipped: add sql/stock/009_*.sql instead.

CREATE FUNCTION stock_freeze_finish_many(p_order_ids bigint[], p_reasons text[])
RETURNS TABLE (finished_order_id bigint, result integer)
LANGUAGE plpgsql AS $$
DECLARE
  o bigint[];
  a bigint[];
  t integer[];
  bk integer[];
  q integer[];
  c boolean[];
  b record;
BEGIN
  IF p_order_ids IS NULL OR p_reasons IS NULL
     OR cardinality(p_order_ids) <> cardinality(p_reasons)
     OR array_position(p_order_ids, NULL) IS NOT NULL THEN
    RAISE EXCEPTION 'stock_freeze_finish_many: one reason per order id, and no order id NULL'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF (SELECT count(DISTINCT x) FROM unnest(p_order_ids) x) <> cardinality(p_order_ids) THEN
    RAISE EXCEPTION 'stock_freeze_finish_many: an order id given twice'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  WITH want AS (
    SELECT w.order_id, w.reason FROM unnest(p_order_ids, p_reasons) AS w(order_id, reason)
  ), due AS (
    SELECT f.order_id FROM stock_freeze f
     WHERE f.order_id = ANY (p_order_ids) AND f.state = 'FROZEN'
     ORDER BY f.order_id
       FOR UPDATE
  ), done AS (
    UPDATE stock_freeze s
       SET state = CASE WHEN want.reason IS NULL THEN 'CONFIRMED' ELSE 'RELEASED' END,
           release_reason = want.reason, finished_at = now()
      FROM due, want
     WHERE s.order_id = due.order_id AND want.order_id = due.order_id AND s.state = 'FROZEN'
    RETURNING s.order_id, s.activity_id, s.ticket_type, s.bucket_id, s.qty, want.reason IS NULL AS confirmed
  )
  SELECT array_agg(done.order_id), array_agg(done.activity_id), array_agg(done.ticket_type),
         array_agg(done.bucket_id), array_agg(done.qty), array_agg(done.confirmed)
    INTO o, a, t, bk, q, c
    FROM done;
  IF o IS NOT NULL THEN
    FOR b IN
      SELECT x.activity_id, x.ticket_type, x.bucket_id, sum(x.qty) AS qty,
             coalesce(sum(x.qty) FILTER (WHERE x.confirmed), 0) AS sold
        FROM unnest(a, t, bk, q, c) AS x(activity_id, ticket_type, bucket_id, qty, confirmed)
       GROUP BY 1, 2, 3
       ORDER BY 1, 2, 3
    LOOP
      UPDATE activity_ticket_bucket
         SET frozen_count = frozen_count - b.qty, sold_count = sold_count + b.sold
       WHERE activity_id = b.activity_id AND ticket_type = b.ticket_type AND bucket_id = b.bucket_id;
    END LOOP;
    INSERT INTO stock_log (activity_id, ticket_type, bucket_id, order_id, op, qty)
    SELECT x.activity_id, x.ticket_type, x.bucket_id, x.order_id,
           CASE WHEN x.confirmed THEN 'confirm' ELSE 'release' END, x.qty
      FROM unnest(o, a, t, bk, q, c) AS x(order_id, activity_id, ticket_type, bucket_id, qty, confirmed);
  END IF;
  RETURN QUERY
    SELECT w.order_id,
           CASE WHEN w.order_id = ANY (o) THEN 0
                WHEN f.state = 'CONFIRMED' THEN -6
                WHEN f.state = 'RELEASED' THEN -7
                ELSE -8 END
      FROM unnest(p_order_ids) WITH ORDINALITY AS w(order_id, n)
      LEFT JOIN stock_freeze f ON f.order_id = w.order_id
     ORDER BY w.n;
END
$$;

COMMENT ON FUNCTION stock_freeze_finish_many(bigint[], text[]) IS
  'Confirm (reason NULL) or release (reason cancel/expire) many frozen orders '
  'exactly once, each bucket updated once: per order 0 done, -6 confirmed '
  'before, -7 released before, -8 unknown.';
