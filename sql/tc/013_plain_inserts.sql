-- sql/tc/013_plain_inserts.sql - begins and history rows inserted without
-- ON CONFLICT where no conflict can come (coordinator database, version 13).
--
-- An INSERT ... ON CONFLICT inserts speculatively: it takes a speculative
-- token, checks the arbiter index, inserts, and then writes a second WAL
-- record to confirm the tuple (HEAP_CONFIRM), whether or not anything
-- conflicted.  Two of the coordinator's hot inserts paid that on every
-- transaction (about 100 bytes of WAL per order, measured with
-- pg_walinspect: bench/README.md, "Sixteenth session"):
--
--   * tc_begin_batch: the arbiter is the application's idempotency key,
--     and most begins carry none (rm_tm_begin_branch, GlobalBegin without
--     one): those rows go in with a plain INSERT, the keyed ones as before.
--
--   * tc__finish_many: the history row of a global is now inserted from
--     the global rows the same statement deletes (DELETE ... RETURNING),
--     so only the transaction that really finished a global writes its
--     history: a second finisher of the same xid waits for the first on
--     the global row, then finds it gone and inserts nothing.  That is what
--     ON CONFLICT (xid) DO NOTHING was there for.  An xid listed twice in
--     one call keeps its first status, as before.  The branches still come
--     from the snapshot of the statement, before its own DELETE of them.
--
-- Same results and statuses as 008's and 002's; test_schema.sh checks the
-- idempotent begin, the history of a finished global and the second finish.
--
-- And one estimate: tc_claim_retries returns at most p_limit rows (a few),
-- but a set-returning function is assumed to return 1000, so the leader's
-- claim (tc_store_read.c, "LEFT JOIN branch_table b ON b.xid = c.xid",
-- every recovery interval) hashed the whole branch_table, live and dead
-- rows, instead of looking up the claimed globals' branches by index
-- (1.5 ms a claim under load, auto_explain).  ROWS 16 tells the planner.
--
-- Never edit this file after it has shipped: add sql/tc/014_*.sql instead.

CREATE OR REPLACE FUNCTION tc_begin_batch(p_xid text[], p_txid bigint[], p_timeout_ms integer[], p_name text[],
                                          p_app text[], p_group text[], p_idem text[], p_node integer)
  RETURNS TABLE(item integer, xid text, result text)
  LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_inserted text[];
BEGIN
  WITH plain AS (
    INSERT INTO global_table (xid, transaction_id, status, application_id, app_group,
                              transaction_name, timeout_ms, deadline, node_id, idem_key)
    SELECT u.x, u.t, 1, u.a, u.g, u.n, u.ms, clock_timestamp() + u.ms * interval '1 millisecond',
           p_node, NULL
      FROM unnest(p_xid, p_txid, p_timeout_ms, p_name, p_app, p_group, p_idem)
           AS u(x, t, ms, n, a, g, k)
     WHERE u.k IS NULL
    RETURNING global_table.xid),
  keyed AS (
    INSERT INTO global_table (xid, transaction_id, status, application_id, app_group,
                              transaction_name, timeout_ms, deadline, node_id, idem_key)
    SELECT u.x, u.t, 1, u.a, u.g, u.n, u.ms, clock_timestamp() + u.ms * interval '1 millisecond',
           p_node, u.k
      FROM unnest(p_xid, p_txid, p_timeout_ms, p_name, p_app, p_group, p_idem)
           AS u(x, t, ms, n, a, g, k)
     WHERE u.k IS NOT NULL
    ON CONFLICT (application_id, idem_key) WHERE idem_key IS NOT NULL DO NOTHING
    RETURNING global_table.xid)
  SELECT coalesce(array_agg(i.x), '{}') INTO v_inserted
    FROM (SELECT plain.xid AS x FROM plain UNION ALL SELECT keyed.xid FROM keyed) i;

  IF cardinality(v_inserted) = cardinality(p_xid) THEN
    RETURN QUERY SELECT u.i::int, u.x, 'ok'::text
                   FROM unnest(p_xid) WITH ORDINALITY AS u(x, i) ORDER BY u.i;
    RETURN;
  END IF;
  -- Items not inserted repeated an idempotency key of their application:
  -- answer the first xid.
  -- (A new statement: it sees the rows of a concurrent begin that the
  -- insert waited for.)
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN u.x = ANY (v_inserted) THEN u.x ELSE g.xid END,
         CASE WHEN u.x = ANY (v_inserted) OR g.xid IS NOT NULL THEN 'ok' ELSE 'finished' END
    FROM unnest(p_xid, p_app, p_idem) WITH ORDINALITY AS u(x, a, k, i)
    LEFT JOIN global_table g ON NOT (u.x = ANY (v_inserted)) AND g.idem_key = u.k
                            AND g.application_id = u.a
   ORDER BY u.i;
END $$;

CREATE OR REPLACE FUNCTION tc__finish_many(p_xid text[], p_status smallint[],
                                           p_branch_status smallint DEFAULT NULL)
  RETURNS void
  LANGUAGE plpgsql AS $$
BEGIN
  -- One statement: every part sees the rows as they were before it, so
  -- history reads the branches that the same statement deletes.
  WITH gone AS (
    DELETE FROM global_table g WHERE g.xid = ANY (p_xid)
    RETURNING g.xid, g.transaction_id, g.application_id, g.app_group, g.transaction_name, g.begin_time),
  del_branches AS (DELETE FROM branch_table WHERE xid = ANY (p_xid)),
  del_locks AS (DELETE FROM lock_table WHERE xid = ANY (p_xid))
  INSERT INTO global_history (xid, transaction_id, status, application_id, app_group,
                              transaction_name, begin_time, branches)
  SELECT g.xid, g.transaction_id, f.s, g.application_id, g.app_group, g.transaction_name,
         g.begin_time, coalesce(br.branches, '[]'::jsonb)
    FROM gone g
    JOIN LATERAL (SELECT u.s FROM unnest(p_xid, p_status) WITH ORDINALITY AS u(x, s, i)
                   WHERE u.x = g.xid ORDER BY u.i LIMIT 1) f ON true
    LEFT JOIN LATERAL (
      SELECT jsonb_agg(jsonb_build_object('branch_id', b.branch_id, 'resource_id', b.resource_id,
                                          'branch_type', b.branch_type,
                                          'status', coalesce(p_branch_status, b.status))
                       ORDER BY b.branch_id) AS branches
        FROM branch_table b WHERE b.xid = g.xid) br ON true;
END $$;

ALTER FUNCTION tc_claim_retries(integer, integer) ROWS 16;
