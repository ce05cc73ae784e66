-- 002_waitlist_notice.sql - notices of the waitlist and of queued orders
-- not made (events database, version 2).
--
-- The notify group also tells a waiting user what became of the wait
-- (the order events waitlist.ordered and waitlist.refused, written by
-- order-service: sql/orders/006): an order of theirs can now have two
-- notices, "waitlist_ordered" when it was placed for them and "paid"
-- later, so a notice is one per (order, kind).
--
-- Never edit this file after it has shipped: add sql/events/003_*.sql instead.

ALTER TABLE member_notice
  DROP CONSTRAINT member_notice_kind_check,
  ADD CONSTRAINT member_notice_kind_check
    CHECK (kind IN ('paid', 'rejected', 'waitlist_ordered', 'waitlist_refused')),
  DROP CONSTRAINT member_notice_pkey,
  ADD CONSTRAINT member_notice_pkey PRIMARY KEY (order_id, kind);

COMMENT ON TABLE member_notice IS
  'Notices to members (consumer group "notify"): one row per order and kind; '
  'a user on hold (member_hold) gets none until the hold is lifted.';
COMMENT ON COLUMN member_notice.kind IS
  'What happened: paid; rejected (a queued order that was not made: order.rejected); waitlist_ordered (an order was placed for the waiting member); '
  'waitlist_refused (the wait ended without an order; the reason is in the text).';
COMMENT ON COLUMN member_notice.order_id IS
  'The order the notice is about (for waitlist_refused: the id the event was keyed by).';
