-- sql/stock/004_freeze_without_bucket_fk.sql - stock_freeze rows no longer
-- carry a foreign key to their bucket (stock database, version 4).
--
-- Why: every stock_freeze INSERT ran the foreign key's check, a SELECT ...
-- FOR KEY SHARE of the bucket row; in a flash sale that row is the hot row
-- other freezes are updating at the same moment, so each check also turned
-- the row's lock into a multixact (their FOR NO KEY UPDATE plus this KEY
-- SHARE), which every later reader and writer of the row must resolve.
-- The check protected nothing that is not already guaranteed: a freeze is
-- only recorded together with the guarded UPDATE of its bucket's counts in
-- the same transaction (stock_freeze_apply, the stock-service's AT branch
-- and its delta update), and that UPDATE fails when the bucket does not
-- exist; bucket rows are never deleted.
--
-- Never edit this file after it has shipped: add sql/stock/005_*.sql instead.

ALTER TABLE stock_freeze DROP CONSTRAINT stock_freeze_bucket_fkey;
