-- sql/rm/004_undo_text.sql - the undo kept as the text librmclient wrote
-- (version 4).
--
-- rollback_info was jsonb.  Nothing reads it as jsonb: librmclient reads
-- rollback_info::text and parses it itself (rm_image.c, which checks every
-- item), and writes it from its own encoder.  What jsonb cost is its binary
-- form, a header of four bytes for every element and every key: the usual
-- undo of a stock freeze (two inserts and a delta, rm_image.h NOTES) took
-- 312 bytes as jsonb and takes about 200 as text, written to the WAL with
-- every branch (issue 23 counts it: bench/README.md, "Seventeenth
-- session"), and PostgreSQL no longer parses it on the way in.
--
-- Compatible both ways: a library of before this version writes
-- "$4::jsonb", which PostgreSQL assigns to a text column as its text; this
-- version's library writes its parameter without a cast, which takes the
-- column's type, so it also writes to a table still at version 3 (or one
-- made by hand).  The rows already there keep their content, as jsonb's
-- text.
--
-- undo_log holds the branches in flight and those not yet deleted (a few
-- thousand rows at most), so the rewrite takes a moment.
--
-- Never edit this file after it has shipped: add sql/rm/005_*.sql instead.

ALTER TABLE undo_log ALTER COLUMN rollback_info TYPE text USING rollback_info::text;

COMMENT ON COLUMN undo_log.rollback_info IS
  'The undo itself, as the JSON text librmclient wrote (rm-client/src/at/rm_image.h): the items of the branch '
  '(table, primary key and what to check or put back for each row; for a delta, the column and the amount). '
  'NULL only in guard rows (log_status = 1).  text since version 4 (jsonb before).';
