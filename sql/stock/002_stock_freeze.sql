-- sql/stock/002_stock_freeze.sql - durable freezes and their deadlines
-- (stock database, version 2).
--
-- The Redis prefilter (librmclient rm_prefilter_*, lua/) freezes tickets
-- in Redis first; this table is where PostgreSQL, the truth, records each
-- freeze with its buyer and its deadline, so that:
--   * the expiry of unpaid freezes survives a process restart and a Redis
--     restart (the sweep reads due rows here; the Redis expiry zset is only
--     an index, rebuilt from this table by reconciliation);
--   * reconciliation can rebuild Redis's per-user ticket counts and freeze
--     records (activity_ticket_bucket has only per-bucket totals);
--   * confirm and release happen exactly once per order: each is a
--     conditional UPDATE of the row's state, FROZEN -> CONFIRMED or
--     FROZEN -> RELEASED; whoever flips it first wins, the other changes
--     nothing.
-- Every state change moves activity_ticket_bucket's counts in the same
-- transaction (the functions below), so that for each bucket
--   frozen_count = sum(qty) of its FROZEN rows and
--   sold_count  >= sum(qty) of its CONFIRMED rows
-- (sold_count may also hold sales made without the prefilter).

CREATE TABLE stock_freeze (
  order_id       bigint      NOT NULL,
  activity_id    bigint      NOT NULL,
  ticket_type    integer     NOT NULL,
  bucket_id      integer     NOT NULL,
  user_id        bigint      NOT NULL,
  qty            integer     NOT NULL,
  state          text        NOT NULL DEFAULT 'FROZEN',
  deadline       timestamptz NOT NULL,
  release_reason text,
  created_at     timestamptz NOT NULL DEFAULT now(),
  finished_at    timestamptz,
  CONSTRAINT stock_freeze_pkey PRIMARY KEY (order_id),
  CONSTRAINT stock_freeze_bucket_fkey FOREIGN KEY (activity_id, ticket_type, bucket_id)
    REFERENCES activity_ticket_bucket (activity_id, ticket_type, bucket_id),
  CONSTRAINT stock_freeze_order_id_check CHECK (order_id > 0),
  CONSTRAINT stock_freeze_user_id_check CHECK (user_id > 0),
  CONSTRAINT stock_freeze_qty_check CHECK (qty BETWEEN 1 AND 10000),
  CONSTRAINT stock_freeze_state_check CHECK (state IN ('FROZEN', 'CONFIRMED', 'RELEASED')),
  CONSTRAINT stock_freeze_reason_check CHECK (
    (state = 'RELEASED') = (release_reason IS NOT NULL)
    AND (release_reason IS NULL OR release_reason IN ('cancel', 'expire'))),
  CONSTRAINT stock_freeze_finished_check CHECK ((state = 'FROZEN') = (finished_at IS NULL))
);

-- The expiry sweep: due frozen rows of one ticket type, oldest first.
CREATE INDEX stock_freeze_due_idx ON stock_freeze (activity_id, ticket_type, deadline)
  WHERE state = 'FROZEN';
-- Reconciliation: all rows of one activity (per-user sums, records).
CREATE INDEX stock_freeze_activity_user_idx ON stock_freeze (activity_id, user_id);

COMMENT ON TABLE stock_freeze IS
  'One row per order whose tickets the prefilter froze: who, where, how many, '
  'until when, and how it ended. The durable side of the Redis freeze '
  'records and of their expiry deadlines.';
COMMENT ON COLUMN stock_freeze.order_id IS 'trade_order.order_id (orders database).';
COMMENT ON COLUMN stock_freeze.activity_id IS 'activity.activity_id.';
COMMENT ON COLUMN stock_freeze.ticket_type IS 'activity_ticket_bucket.ticket_type.';
COMMENT ON COLUMN stock_freeze.bucket_id IS 'Bucket the tickets were frozen in.';
COMMENT ON COLUMN stock_freeze.user_id IS 'Buyer (counts toward activity.per_user_limit).';
COMMENT ON COLUMN stock_freeze.qty IS 'Tickets frozen (1..10000, as the prefilter allows).';
COMMENT ON COLUMN stock_freeze.state IS
  'FROZEN (held, counted in frozen_count), CONFIRMED (paid: moved to '
  'sold_count) or RELEASED (given back). FROZEN changes once, never back.';
COMMENT ON COLUMN stock_freeze.deadline IS
  'When a FROZEN row expires: the sweep releases it after this moment.';
COMMENT ON COLUMN stock_freeze.release_reason IS 'cancel or expire (RELEASED rows only).';
COMMENT ON COLUMN stock_freeze.created_at IS 'When the freeze was recorded.';
COMMENT ON COLUMN stock_freeze.finished_at IS 'When it was confirmed or released.';

-- stock_freeze_apply: record a freeze the prefilter granted, in the
-- caller's transaction.  Returns 0 (recorded: frozen_count += qty, rows in
-- stock_freeze and stock_log), 1 (this same freeze was recorded before:
-- nothing done), -2 (the user would hold more than activity.per_user_limit:
-- nothing done), -3 (the bucket has not qty available: nothing done), -4
-- (the order id was recorded with other values, or no such activity or
-- bucket), -6 / -7 (the order was
-- recorded and since confirmed / released).  Codes as lua/stock_lib.lua's.
--
-- The limit is checked here too, not only in Redis: after Redis lost
-- writes (a restart) it may let a user through that PostgreSQL must still
-- refuse.  Freezes of one user in one activity take a transaction-level
-- advisory lock on (activity, user), so two concurrent freezes of the same
-- user cannot both see the old total; other users do not wait.
CREATE FUNCTION stock_freeze_apply(p_order_id bigint, p_activity_id bigint,
                                   p_ticket_type integer, p_bucket_id integer,
                                   p_user_id bigint, p_qty integer,
                                   p_deadline timestamptz, p_xid text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  r stock_freeze%ROWTYPE;
  inserted boolean;
  over_limit boolean;
BEGIN
  SELECT * INTO r FROM stock_freeze WHERE order_id = p_order_id;
  IF NOT FOUND THEN
    PERFORM pg_advisory_xact_lock(hashtextextended(
      format('stock_freeze:%s:%s', p_activity_id, p_user_id), 0));
    SELECT coalesce(sum(f.qty), 0) + p_qty > a.per_user_limit INTO over_limit
      FROM activity a
      LEFT JOIN stock_freeze f
        ON f.activity_id = a.activity_id AND f.user_id = p_user_id AND f.state <> 'RELEASED'
     WHERE a.activity_id = p_activity_id
     GROUP BY a.per_user_limit;
    IF over_limit IS NULL THEN
      RETURN -4; -- no such activity
    END IF;
    IF over_limit THEN
      RETURN -2;
    END IF;
    UPDATE activity_ticket_bucket
       SET frozen_count = frozen_count + p_qty
     WHERE activity_id = p_activity_id AND ticket_type = p_ticket_type
       AND bucket_id = p_bucket_id AND stock - frozen_count - sold_count >= p_qty;
    IF NOT FOUND THEN
      PERFORM 1 FROM activity_ticket_bucket
        WHERE activity_id = p_activity_id AND ticket_type = p_ticket_type
          AND bucket_id = p_bucket_id;
      RETURN CASE WHEN FOUND THEN -3 ELSE -4 END; -- sold out, or no such bucket
    END IF;
    INSERT INTO stock_freeze (order_id, activity_id, ticket_type, bucket_id, user_id, qty, deadline)
    VALUES (p_order_id, p_activity_id, p_ticket_type, p_bucket_id, p_user_id, p_qty, p_deadline)
    ON CONFLICT (order_id) DO NOTHING;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    IF inserted THEN
      INSERT INTO stock_log (activity_id, ticket_type, bucket_id, order_id, op, qty, xid)
      VALUES (p_activity_id, p_ticket_type, p_bucket_id, p_order_id, 'freeze', p_qty, p_xid);
      RETURN 0;
    END IF;
    -- A concurrent call recorded the same order first: give the count back
    -- and answer as for an existing row.
    UPDATE activity_ticket_bucket
       SET frozen_count = frozen_count - p_qty
     WHERE activity_id = p_activity_id AND ticket_type = p_ticket_type
       AND bucket_id = p_bucket_id;
    SELECT * INTO r FROM stock_freeze WHERE order_id = p_order_id;
  END IF;
  IF r.activity_id <> p_activity_id OR r.ticket_type <> p_ticket_type
     OR r.bucket_id <> p_bucket_id OR r.user_id <> p_user_id OR r.qty <> p_qty THEN
    RETURN -4;
  END IF;
  RETURN CASE r.state WHEN 'FROZEN' THEN 1 WHEN 'CONFIRMED' THEN -6 ELSE -7 END;
END
$$;

COMMENT ON FUNCTION stock_freeze_apply(bigint, bigint, integer, integer, bigint, integer, timestamptz, text) IS
  'Record a prefilter freeze: 0 done, 1 done before, -2 over the user limit, '
  '-3 sold out, -4 other values, -6 confirmed, -7 released.';

-- stock_freeze_finish: FROZEN -> CONFIRMED (p_reason NULL) or -> RELEASED
-- (p_reason 'cancel' or 'expire'), with the bucket's counts, exactly once.
-- Returns 0 (done now), -6 (already confirmed), -7 (already released), -8
-- (no such order).  The state change is one conditional UPDATE: a second,
-- concurrent call waits for the first's row lock, then finds the state
-- changed and does nothing.
CREATE FUNCTION stock_freeze_finish(p_order_id bigint, p_reason text, p_xid text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  r stock_freeze%ROWTYPE;
  st text;
BEGIN
  UPDATE stock_freeze
     SET state = CASE WHEN p_reason IS NULL THEN 'CONFIRMED' ELSE 'RELEASED' END,
         release_reason = p_reason, finished_at = now()
   WHERE order_id = p_order_id AND state = 'FROZEN'
  RETURNING * INTO r;
  IF NOT FOUND THEN
    SELECT state INTO st FROM stock_freeze WHERE order_id = p_order_id;
    RETURN CASE st WHEN 'CONFIRMED' THEN -6 WHEN 'RELEASED' THEN -7 ELSE -8 END;
  END IF;
  IF p_reason IS NULL THEN
    UPDATE activity_ticket_bucket
       SET frozen_count = frozen_count - r.qty, sold_count = sold_count + r.qty
     WHERE activity_id = r.activity_id AND ticket_type = r.ticket_type AND bucket_id = r.bucket_id;
  ELSE
    UPDATE activity_ticket_bucket
       SET frozen_count = frozen_count - r.qty
     WHERE activity_id = r.activity_id AND ticket_type = r.ticket_type AND bucket_id = r.bucket_id;
  END IF;
  INSERT INTO stock_log (activity_id, ticket_type, bucket_id, order_id, op, qty, xid)
  VALUES (r.activity_id, r.ticket_type, r.bucket_id, r.order_id,
          CASE WHEN p_reason IS NULL THEN 'confirm' ELSE 'release' END, r.qty, p_xid);
  RETURN 0;
END
$$;

COMMENT ON FUNCTION stock_freeze_finish(bigint, text, text) IS
  'Confirm (reason NULL) or release (reason cancel/expire) a frozen order '
  'exactly once: 0 done, -6 confirmed before, -7 released before, -8 unknown.';

-- stock_freeze_expire: release up to p_limit FROZEN rows of one ticket type
-- whose deadline is <= p_now (reason 'expire'), oldest first, and return
-- them.  Rows another transaction holds are skipped (SKIP LOCKED), so
-- concurrent sweeps split the work instead of queueing; each row is
-- released by exactly one of them (the state check in the UPDATE).
-- Lock order: the freeze rows first (never waiting), then the buckets one
-- by one in ascending bucket_id, with the quantities summed per bucket, so
-- that two sweeps (or a sweep and a confirm, which holds one bucket) never
-- wait for each other in a cycle.
CREATE FUNCTION stock_freeze_expire(p_activity_id bigint, p_ticket_type integer,
                                    p_now timestamptz, p_limit integer)
RETURNS TABLE (expired_order_id bigint, expired_user_id bigint, expired_bucket_id integer,
               expired_qty integer)
LANGUAGE plpgsql AS $$
DECLARE
  o bigint[];
  u bigint[];
  bk integer[];
  q integer[];
  b record;
BEGIN
  WITH due AS (
    SELECT f.order_id FROM stock_freeze f
     WHERE f.activity_id = p_activity_id AND f.ticket_type = p_ticket_type
       AND f.state = 'FROZEN' AND f.deadline <= p_now
     ORDER BY f.deadline
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  ), done AS (
    UPDATE stock_freeze s
       SET state = 'RELEASED', release_reason = 'expire', finished_at = now()
      FROM due
     WHERE s.order_id = due.order_id AND s.state = 'FROZEN'
    RETURNING s.order_id, s.user_id, s.bucket_id, s.qty
  )
  SELECT array_agg(done.order_id), array_agg(done.user_id), array_agg(done.bucket_id),
         array_agg(done.qty)
    INTO o, u, bk, q
    FROM done;
  IF o IS NULL THEN
    RETURN;
  END IF;
  FOR b IN
    SELECT x.bucket_id, sum(x.qty) AS qty
      FROM unnest(bk, q) AS x(bucket_id, qty)
     GROUP BY x.bucket_id
     ORDER BY x.bucket_id
  LOOP
    UPDATE activity_ticket_bucket
       SET frozen_count = frozen_count - b.qty
     WHERE activity_id = p_activity_id AND ticket_type = p_ticket_type
       AND bucket_id = b.bucket_id;
  END LOOP;
  INSERT INTO stock_log (activity_id, ticket_type, bucket_id, order_id, op, qty)
  SELECT p_activity_id, p_ticket_type, x.bucket_id, x.order_id, 'release', x.qty
    FROM unnest(o, bk, q) AS x(order_id, bucket_id, qty);
  RETURN QUERY SELECT * FROM unnest(o, u, bk, q);
END
$$;

COMMENT ON FUNCTION stock_freeze_expire(bigint, integer, timestamptz, integer) IS
  'Release due FROZEN freezes of one ticket type (at most p_limit), once each; '
  'returns the released rows.';
