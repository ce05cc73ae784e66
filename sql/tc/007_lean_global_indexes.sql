-- sql/tc/007_lean_global_indexes.sql - two fewer index entries per global
-- transaction (coordinator database, version 7).
--
-- global_table is a queue table: every global transaction inserts a row,
-- and deletes it a few milliseconds later.  Each index on it costs an
-- entry written (WAL, flushed by the durable batch that follows) and an
-- entry that the next autovacuum must find and remove; at thousands of
-- transactions a second that vacuum runs every second, and the durable
-- batches that overlap it are the slowest ones of a run.  Two of its four
-- indexes did no work:
--
--   * global_table_transaction_id_key (UNIQUE (transaction_id)): nothing
--     looks a session up by transaction_id, and the values come from
--     tc_id_block_seq blocks, which no two nodes share: the constraint could
--     never fire.  Dropped.
--   * global_table_idem_key_key (UNIQUE (idem_key)): a btree indexes NULLs,
--     so every begin without an idempotency key wrote an entry that no
--     lookup can use.  Replaced by a unique index over the keys that exist;
--     tc_begin_batch names that index's predicate in its ON CONFLICT clause
--     (otherwise PostgreSQL cannot infer a partial index as the arbiter) and
--     is otherwise unchanged.
--
-- Never edit this file after it has shipped: add sql/tc/008_*.sql instead.

ALTER TABLE global_table DROP CONSTRAINT global_table_transaction_id_key;

CREATE UNIQUE INDEX global_table_idem_key_idx ON global_table (idem_key)
  WHERE idem_key IS NOT NULL;
ALTER TABLE global_table DROP CONSTRAINT global_table_idem_key_key;

COMMENT ON COLUMN global_table.transaction_id IS
  'Numeric id from tc_id_block_seq blocks; unique across nodes by '
  'construction (no two nodes share a block), so not indexed.';
COMMENT ON INDEX global_table_idem_key_idx IS
  'A retried GlobalBegin with the same idempotency key finds the first xid '
  '(tc_begin_batch); begins without a key have no entry.';

-- GlobalBegin, as in 002 but with the partial index as the conflict
-- arbiter.
CREATE OR REPLACE FUNCTION tc_begin_batch(p_xid text[], p_txid bigint[], p_timeout_ms int[],
                                          p_name text[], p_app text[], p_idem text[], p_node int)
RETURNS TABLE (item int, xid text, result text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_inserted text[];
BEGIN
  WITH ins AS (
    INSERT INTO global_table (xid, transaction_id, status, application_id, transaction_name,
                              timeout_ms, deadline, node_id, idem_key)
    SELECT u.x, u.t, 1, u.a, u.n, u.ms, clock_timestamp() + u.ms * interval '1 millisecond',
           p_node, u.k
      FROM unnest(p_xid, p_txid, p_timeout_ms, p_name, p_app, p_idem) AS u(x, t, ms, n, a, k)
    ON CONFLICT (idem_key) WHERE idem_key IS NOT NULL DO NOTHING
    RETURNING global_table.xid)
  SELECT coalesce(array_agg(ins.xid), '{}') INTO v_inserted FROM ins;

  IF cardinality(v_inserted) = cardinality(p_xid) THEN
    RETURN QUERY SELECT u.i::int, u.x, 'ok'::text
                   FROM unnest(p_xid) WITH ORDINALITY AS u(x, i) ORDER BY u.i;
    RETURN;
  END IF;
  -- Items not inserted repeated an idempotency key: answer the first xid.
  -- (A new statement: it sees the rows of a concurrent begin that the
  -- insert waited for.)
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN u.x = ANY (v_inserted) THEN u.x ELSE g.xid END,
         CASE WHEN u.x = ANY (v_inserted) OR g.xid IS NOT NULL THEN 'ok' ELSE 'finished' END
    FROM unnest(p_xid, p_idem) WITH ORDINALITY AS u(x, k, i)
    LEFT JOIN global_table g ON NOT (u.x = ANY (v_inserted)) AND g.idem_key = u.k
   ORDER BY u.i;
END $$;
