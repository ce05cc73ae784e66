-- 006_waitlist_events.sql - what became of a waiting user, or of a queued
-- order, reaches them as an event (orders database, version 6).
--
-- In the queued order mode (ORDER_MODE=queued, examples/order_queue.h)
-- the buyer is answered once Redis froze the tickets; when PostgreSQL then
-- refuses them (Redis had lost writes) the order is not made, and the
-- buyer hears of it as "order.rejected" (the payload's reason).
--
-- When stock comes back (a cancel, an expiry, more tickets) order-service
-- serves the waitlist: each waiting user served gets an order, and hears
-- of it through the outbox, "waitlist.ordered" keyed by that order; a user
-- the waitlist removed (their limit no longer fits) or whose order could
-- not be placed gets "waitlist.refused" (keyed by an order id taken for
-- the notice, or the order that was not placed) with the reason in the
-- payload.  The notification consumer (event-consumers, group notify)
-- writes the member's notice once.
--
-- An order now has up to two events: the waitlist's, then its end (paid,
-- cancelled, expired).  The rule "one final event per order" stays, as a
-- unique index over the order.* events alone.
--
-- Never edit this file after it has shipped: add sql/orders/007_*.sql instead.

ALTER TABLE order_outbox
  DROP CONSTRAINT order_outbox_type_check,
  ADD CONSTRAINT order_outbox_type_check
    CHECK (event_type IN ('order.paid', 'order.cancelled', 'order.expired', 'order.rejected',
                          'waitlist.ordered', 'waitlist.refused')),
  DROP CONSTRAINT order_outbox_order_key,
  ADD CONSTRAINT order_outbox_order_type_key UNIQUE (order_id, event_type);

-- One final event per order: an order leaves UNPAID once.
CREATE UNIQUE INDEX order_outbox_order_end_key ON order_outbox (order_id)
  WHERE event_type IN ('order.paid', 'order.cancelled', 'order.expired');

COMMENT ON COLUMN order_outbox.event_type IS
  'order.paid, order.cancelled or order.expired (the order''s end, one per order); '
  'order.rejected (a queued order that was not made); '
  'waitlist.ordered or waitlist.refused (what became of a waiting user).';
COMMENT ON COLUMN order_outbox.order_id IS
  'The order whose state changed (trade_order.order_id); for waitlist.refused of a user '
  'removed from the waitlist, an order id taken for the notice alone (no trade_order row).';
