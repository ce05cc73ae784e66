-- sql/tc/018_idem_key_hash.sql - the branches' idempotency keys indexed by
-- a 64-bit hash of (xid, key) (coordinator database, version 18).
--
-- librmclient sends a 32-character idempotency key with every
-- registration, so each entry of branch_table_xid_idem_key_key carried
-- the xid and the key, about 80 bytes: 133-147 bytes of WAL per order
-- (pg_walinspect, bench/README.md, "Twenty-first session").  The index
-- now holds hashtextextended(idem_key, hashtextextended(xid, 0)), 8
-- bytes.
--
-- Its one job stays the same: two registrations of one key in one xid
-- that run at once cannot both insert (the second meets 23505, runs again
-- alone and finds the first: tc_store.c).  Finding a repeated key never
-- needs this index since 017: tc_register_batch looks each keyed item up
-- by its xid, through the primary key (xid, branch_id), and compares the
-- key itself.  Two different pairs with one hash would refuse the later
-- registration (TXP_ESTORE; the RM may retry it, with the same key, and
-- meet the same refusal until the other branch's global ends): with n
-- live keyed branches that happens with probability about n^2 / 2^65,
-- below 10^-7 for a million at once.
--
-- test_schema.sh checks the key refused within an xid and admitted across
-- xids, and the repeated key's answer.
--
-- Never edit this file after it has shipped: add sql/tc/019_*.sql instead.

DROP INDEX branch_table_xid_idem_key_key;
CREATE UNIQUE INDEX branch_table_idem_hash_key
  ON branch_table ((hashtextextended(idem_key, hashtextextended(xid, 0))))
  WHERE idem_key IS NOT NULL;
COMMENT ON INDEX branch_table_idem_hash_key IS
  'One registration per idempotency key and xid, as a 64-bit hash of the pair (sql/tc/018_idem_key_hash.sql).';
COMMENT ON COLUMN branch_table.idem_key IS
  'Optional idempotency key of BranchRegister, unique per xid (a partial unique index over a hash of (xid, idem_key), sql/tc/018): a retried register returns the existing branch_id. NULL = none.';
