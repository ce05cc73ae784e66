-- 005_user_limit_on_insert.sql - the per-user limit is PostgreSQL's on
-- every path that freezes stock, not only stock_freeze_apply's.
--
-- stock_freeze_apply (the local path, and the prefilter's reconciliation)
-- checks activity.per_user_limit itself; the global path's freeze is an AT
-- insert of its stock_freeze row by stock-service, which checked nothing:
-- a Redis master that lost its last second of writes in a failover
-- forgets what a user already bought, lets the user buy again, and only
-- PostgreSQL can still refuse (issue 22).  So the check moves to the row:
-- a trigger before every insert into stock_freeze, under the same
-- transaction-level advisory lock on (activity, user) stock_freeze_apply
-- takes (taken again in the same transaction it is free), so that two
-- concurrent freezes of one user cannot both see the old total; other
-- users do not wait.  The row being inserted is not counted if it exists
-- already (ON CONFLICT DO NOTHING of the same order).
--
-- A refusal raises SQLSTATE 23514 (check_violation) with the message
-- "over_limit: ..." and aborts the statement, so the caller's transaction
-- (an AT branch's phase one) rolls back with nothing written; stock-service
-- answers 409 over_limit.  Undo (a rollback deleting the row) and the
-- state changes (UPDATE) do not insert and are not checked.
--
-- Lock order: stock_freeze_apply takes the advisory lock before the bucket
-- row; stock-service's AT mode (STOCK_FREEZE_MODE=at) updates the bucket row
-- before it inserts the freeze, so a user's two concurrent orders through
-- the two paths in that mode can deadlock; PostgreSQL then aborts one
-- (deadlock_timeout), which the caller sees as a failed freeze and retries.
-- The default (deferred) and delta modes write the bucket last.

CREATE FUNCTION stock_freeze_limit_check() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  held bigint;
  lim integer;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(
    format('stock_freeze:%s:%s', NEW.activity_id, NEW.user_id), 0));
  SELECT per_user_limit INTO lim FROM activity WHERE activity_id = NEW.activity_id;
  IF NOT FOUND THEN
    RETURN NEW; -- no such activity: the bucket's checks refuse it
  END IF;
  SELECT coalesce(sum(qty), 0) INTO held FROM stock_freeze
   WHERE activity_id = NEW.activity_id AND user_id = NEW.user_id AND state <> 'RELEASED'
     AND order_id <> NEW.order_id;
  IF held + NEW.qty > lim THEN
    RAISE EXCEPTION 'over_limit: user % would hold % tickets of activity % (limit %)',
      NEW.user_id, held + NEW.qty, NEW.activity_id, lim USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END
$$;

COMMENT ON FUNCTION stock_freeze_limit_check() IS
  'Before an insert into stock_freeze: refuse (23514, "over_limit: ...") a freeze that would put its user over '
  'activity.per_user_limit, under the (activity, user) advisory lock stock_freeze_apply takes.';

CREATE TRIGGER stock_freeze_limit BEFORE INSERT ON stock_freeze
  FOR EACH ROW EXECUTE FUNCTION stock_freeze_limit_check();
