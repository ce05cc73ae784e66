-- 006_sale_window.sql - the sale window: a freeze is PostgreSQL's only
-- while the activity is on sale (stock database, version 6).
--
-- activity.starts_at and ends_at existed, but nothing read them.  From
-- here on an activity is on sale when
--     status = 1 AND starts_at <= t < ends_at
-- with t the database's clock at the freeze (clock_timestamp()).  Both
-- halves are needed: status is what stock-service's window job
-- (examples/stock_window.c) sets at the times, 0 -> 1 at starts_at and
-- -> 2 at ends_at, and what the Redis prefilter's copy shows; the times
-- make the close exact even when the job is late, stopped or behind a
-- lost connection (a sale never stays open past ends_at), and an early
-- status 1 (a seed, an operator) does not open a sale before starts_at.
-- The Lua prefilter applies the same rule to the same values, with the
-- Redis server's clock (lua/stock_lib.lua, pf_on_sale).
--
-- The check sits where every freeze passes:
--   * a trigger before every insert into stock_freeze (the global path's
--     AT insert by stock-service, and stock_freeze_apply's own insert):
--     SQLSTATE 23514 with the message "not_on_sale: ...", the statement
--     and the caller's transaction (an AT branch's phase one) roll back;
--     stock-service answers 409 not_on_sale.  It is named so that it runs
--     before stock_freeze_limit (triggers fire in name order): a refused
--     freeze takes no advisory lock;
--   * stock_freeze_apply (the local path through stock_local_freeze, and
--     rm_prefilter_pg_freeze) checks first and returns -1, the Lua code
--     for not on sale, with nothing written, so that the local path can
--     record the refusal: stock_compensation accepts refusal -1 and
--     stock_local_freeze passes it on (the order is cancelled with the
--     reason not_on_sale).
-- A repeat of a freeze recorded before (same order) is answered as
-- before, whatever the time: the decision was taken when it was inside.
-- Limit: a local-mode order that the prefilter let through just before
-- ends_at, whose stock side the compensation job decides after it, is
-- refused then (the decision is taken when the freeze is recorded).
--
-- Never edit this file after it has shipped: add sql/stock/007_*.sql instead.

CREATE FUNCTION activity_on_sale(p_activity_id bigint, p_at timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM activity
                  WHERE activity_id = p_activity_id AND status = 1
                    AND starts_at <= p_at AND p_at < ends_at)
$$;

COMMENT ON FUNCTION activity_on_sale(bigint, timestamptz) IS
  'Whether the activity is on sale at p_at: status 1 and p_at in [starts_at, ends_at).';

CREATE FUNCTION stock_freeze_window_check() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  a activity%ROWTYPE;
  t timestamptz := clock_timestamp();
BEGIN
  SELECT * INTO a FROM activity WHERE activity_id = NEW.activity_id;
  IF NOT FOUND THEN
    RETURN NEW; -- no such activity: the bucket's checks refuse it
  END IF;
  IF a.status <> 1 OR t < a.starts_at OR t >= a.ends_at THEN
    RAISE EXCEPTION 'not_on_sale: activity % is not on sale at % (status %, window % to %)',
      NEW.activity_id, t, a.status, a.starts_at, a.ends_at USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END
$$;

COMMENT ON FUNCTION stock_freeze_window_check() IS
  'Before an insert into stock_freeze: refuse (23514, "not_on_sale: ...") a freeze of an activity '
  'that is not on sale now (activity_on_sale''s rule).';

CREATE TRIGGER stock_freeze_in_window BEFORE INSERT ON stock_freeze
  FOR EACH ROW EXECUTE FUNCTION stock_freeze_window_check();

-- stock_freeze_apply as in 002, with the window checked first for a new
-- freeze: -1 (not on sale), or -4 when there is no such activity.
CREATE OR REPLACE FUNCTION stock_freeze_apply(p_order_id bigint, p_activity_id bigint,
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
    IF NOT activity_on_sale(p_activity_id, clock_timestamp()) THEN
      PERFORM 1 FROM activity WHERE activity_id = p_activity_id;
      RETURN CASE WHEN FOUND THEN -1 ELSE -4 END;
    END IF;
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
  'Record a prefilter freeze: 0 done, 1 done before, -1 not on sale (activity_on_sale), -2 over the '
  'user limit, -3 sold out, -4 other values, -6 confirmed, -7 released.';

-- A local-mode order refused because the sale was not open.
ALTER TABLE stock_compensation DROP CONSTRAINT stock_compensation_state_check;
ALTER TABLE stock_compensation ADD CONSTRAINT stock_compensation_state_check CHECK (
  (state = 'FROZEN' AND refusal IS NULL)
  OR (state = 'REFUSED' AND refusal IN (-1, -2, -3, -4)));

COMMENT ON COLUMN stock_compensation.refusal IS
  'REFUSED rows: stock_freeze_apply''s code, -1 not on sale, -2 over the user limit, -3 sold '
  'out, -4 invalid (no such bucket, or the order id recorded with other values).';

-- stock_local_freeze as in 003, passing -1 on as a refusal.
CREATE OR REPLACE FUNCTION stock_local_freeze(p_order_id bigint, p_activity_id bigint,
                                              p_ticket_type integer, p_bucket_id integer,
                                              p_user_id bigint, p_qty integer,
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
  IF code NOT IN (-1, -2, -3, -4) THEN
    RAISE EXCEPTION 'stock_freeze_apply returned unexpected code %', code;
  END IF;
  UPDATE stock_compensation SET state = 'REFUSED', refusal = code WHERE order_id = p_order_id;
  RETURN code;
END
$$;

COMMENT ON FUNCTION stock_local_freeze(bigint, bigint, integer, integer, bigint, integer, timestamptz, text) IS
  'Stock side of a local-mode order, decided once: 0 frozen, 1 frozen before, -1 not on sale, '
  '-2 over limit, -3 sold out, -4 invalid, -9 recorded with other values.';

-- The window job's scan: activities not ended yet.
CREATE INDEX activity_open_idx ON activity (ends_at) WHERE status < 2;
