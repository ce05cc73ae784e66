-- sql/tc/017_store_key_lookups.sql - the store's batch functions read the
-- queue tables by their keys, whatever the statistics say; a registration
-- looks repeated idempotency keys up one by one, in an index of their
-- hashes (coordinator database, version 17).
--
-- order-load in AT mode, whose registrations carry idempotency keys, read
-- 293 rows in the coordinator database per order
-- (pg_stat_database.tup_returned), against 23 per transaction in
-- tc-bench, whose registrations carry none.  Nearly all of them came from
-- step 2 of tc_register_batch, the look for a repeated key: under load,
-- 1.4 ms per batch, and idx_tup_read of branch_table_xid_idem_key_key
-- about 2,000 entries per batch (the live and dead entries of the whole
-- index).
--
-- The cause is general.  A function's plans are cached per session, and
-- made again after a vacuum or analyze of a table they read, from the
-- tables' sizes at that moment.  A queue table is nearly empty right
-- after its vacuum, and grows by hundreds of times in dead rows before the
-- next: a plan made then joins the batch's items with a scan of the whole
-- table (a hash join, seen with EXPLAIN EXECUTE under plan_cache_mode =
-- force_generic_plan on a freshly migrated database), and a table vacuumed
-- empty costs nothing to scan at all.  So the plans were made when the
-- tables looked smallest, and kept while they were largest.
-- test_schema.sh counted 27 sequential scans of the queue tables and the
-- history for one begin-register-decide-report round on vacuumed-empty
-- tables.
--
-- And branch_table_xid_idem_key_key, the unique index over (xid,
-- idem_key): librmclient sends a 32-character idempotency key with every
-- registration, so each entry carried the xid and the key, about 80 bytes
-- (133-147 bytes of WAL per order, pg_walinspect).
--
-- Now:
--   * the key index holds hashtextextended(idem_key, hashtextextended(xid,
--     0)), 8 bytes (branch_table_idem_hash_key).  Its job stays the same:
--     two registrations of one key in one xid that run at once cannot both
--     insert (the second meets 23505, runs again alone and finds the
--     first: tc_store.c).  Two different pairs with one hash would refuse
--     the later registration (TXP_ESTORE, until the other branch's global
--     ends): with n live keyed branches that happens with probability
--     about n^2 / 2^65, below 10^-7 for a million at once;
--   * tc_register_batch looks each keyed item up alone (CROSS JOIN
--     LATERAL ... LIMIT 1), which the planner cannot turn into a join over
--     the whole table, by the xid, the key and the key's hash (either
--     index reads one entry; the key itself decides);
--   * the batch functions tcd calls (tc_begin_batch, tc_register_batch,
--     tc_decide_lock, tc_decide_batch, tc_phase2_batch; tc__finish_many
--     runs inside them) run with enable_seqscan = off: every statement in
--     them finds its rows by xid, branch id or row key, and the setting
--     keeps the planner on those keys when the tables look empty.  It is
--     the function's own setting (restored when it returns), so nothing
--     else in tcd's transaction is planned with it.
--   * tc_register_batch keeps each item's transaction id from its first
--     look at the globals, instead of joining global_table again for the
--     lock rows and the branch rows.
-- Everything else is as it was (tc_register_batch: 014's).  test_schema.sh
-- checks the answers of such a round and that it scans none of the tables,
-- and the key index: a key refused within an xid, admitted across xids.
--
-- Never edit this file after it has shipped: add sql/tc/018_*.sql instead.

DROP INDEX branch_table_xid_idem_key_key;
CREATE UNIQUE INDEX branch_table_idem_hash_key
  ON branch_table ((hashtextextended(idem_key, hashtextextended(xid, 0))))
  WHERE idem_key IS NOT NULL;
COMMENT ON INDEX branch_table_idem_hash_key IS
  'One registration per idempotency key and xid, as a 64-bit hash of the pair (sql/tc/017_store_key_lookups.sql).';
COMMENT ON COLUMN branch_table.idem_key IS
  'Optional idempotency key of BranchRegister, unique per xid (a partial unique index over a hash of (xid, idem_key), sql/tc/017): a retried register returns the existing branch_id. NULL = none.';

CREATE OR REPLACE FUNCTION tc_register_batch(p_xid text[], p_branch bigint[], p_resource text[],
                                  p_type smallint[], p_lock_keys text[], p_app_data text[],
                                  p_client text[], p_idem text[], p_app text[], p_group text[],
                                  l_item int[], l_row text[], l_table text[], l_pk text[])
RETURNS TABLE (item int, result text, branch_id bigint, holder text, holder_status smallint)
LANGUAGE plpgsql
-- Every table here is read by its keys (see the header).
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
  v_active int[];     -- items whose global is Begin, not past its deadline, of their group
  v_denied int[];     -- items whose global another group began
  v_txid bigint[];    -- v_txid[i]: item i's global's transaction_id (NULL: none)
  v_dup int[];        -- items repeating an idempotency key: v_dup_branch[k] is theirs
  v_dup_branch bigint[];
  v_conflict int[];   -- items that met a key held by another xid
  v_holder text[];
  v_holder_status smallint[];
  v_wanted bigint;    -- lock rows of the items that may take keys
  v_taken bigint;     -- of those, the rows the insert took
  v_me xid := pg_current_xact_id()::xid; -- this transaction (it inserts anyway)
BEGIN
  -- 1. Share-lock the globals (in xid order): a decision cannot slip in
  --    between this check and the inserts below.  A global this very
  --    transaction began (xmin = v_me) is read without the lock: no other
  --    transaction sees it before this one commits, so none can decide it.
  --    Only an application of the group that began a global may register
  --    in it (p_group NULL: not checked).  The globals' transaction ids
  --    are kept per item for the inserts below (no second look).
  WITH shared AS (SELECT gt.xid, gt.transaction_id, gt.status, gt.deadline, gt.app_group
                    FROM global_table gt
                   WHERE gt.xid = ANY (p_xid) AND gt.xmin <> v_me ORDER BY gt.xid FOR SHARE)
  SELECT coalesce(array_agg(u.i::int) FILTER (WHERE (u.gr IS NULL OR g.app_group = u.gr)
                                                AND g.status = 1 AND g.deadline >= clock_timestamp()),
                  '{}'),
         coalesce(array_agg(u.i::int) FILTER (WHERE g.xid IS NOT NULL AND u.gr IS NOT NULL
                                                AND g.app_group IS DISTINCT FROM u.gr),
                  '{}'),
         array_agg(g.transaction_id ORDER BY u.i)
    INTO v_active, v_denied, v_txid
    FROM unnest(p_xid, p_group) WITH ORDINALITY AS u(x, gr, i)
    LEFT JOIN (SELECT gt.xid, gt.transaction_id, gt.status, gt.deadline, gt.app_group FROM global_table gt
                WHERE gt.xid = ANY (p_xid) AND gt.xmin = v_me
               UNION ALL
               SELECT s.xid, s.transaction_id, s.status, s.deadline, s.app_group FROM shared s) g
           ON g.xid = u.x;

  -- 2. Repeated idempotency keys (none to look for when no item has one).
  v_dup := '{}';
  v_dup_branch := '{}';
  IF cardinality(array_remove(p_idem, NULL)) > 0 THEN
    --    One lookup per keyed item (LATERAL ... LIMIT 1: never a join
    --    that reads the whole table).
    SELECT coalesce(array_agg(u.i::int), '{}'), coalesce(array_agg(d.branch_id), '{}')
      INTO v_dup, v_dup_branch
      FROM unnest(p_xid, p_idem) WITH ORDINALITY AS u(x, k, i)
      CROSS JOIN LATERAL (SELECT b.branch_id FROM branch_table b
                           WHERE b.xid = u.x AND b.idem_key = u.k
                             -- the key index's expression: read by key too
                             AND hashtextextended(b.idem_key, hashtextextended(b.xid, 0))
                                 = hashtextextended(u.k, hashtextextended(u.x, 0))
                           LIMIT 1) d
     WHERE u.i = ANY (v_active) AND u.k IS NOT NULL;
  END IF;

  v_conflict := '{}';
  -- 3. Locks, in row_key order (then queue order), which keeps concurrent
  --    batches from deadlocking and gives a contended key to the item that
  --    queued first.  The insert counts what it took: when every wanted
  --    key is taken, nothing conflicts, and the usual batch is done with
  --    its locks in one statement.
  IF cardinality(l_item) > 0 THEN
  WITH want AS (
    SELECT l.it, l.r, l.t, l.p
      FROM unnest(l_item, l_row, l_table, l_pk) AS l(it, r, t, p)
     WHERE l.it = ANY (v_active) AND NOT (l.it = ANY (v_dup))),
  ins AS (
    INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk)
    SELECT w.r, p_xid[w.it], v_txid[w.it], p_branch[w.it], p_resource[w.it], w.t, w.p
      FROM want w
     ORDER BY w.r, w.it
    ON CONFLICT (row_key) DO NOTHING
    RETURNING 1)
  SELECT (SELECT count(*) FROM want), (SELECT count(*) FROM ins) INTO v_wanted, v_taken;

  -- 4. Otherwise the conflicts, in a statement of its own (a snapshot taken
  --    after the insert, which waited for any concurrent batch that held
  --    one of the keys): a wanted key whose row belongs to another xid.  A
  --    key whose row this batch inserted for another item, or that nobody
  --    holds any more, shows as a conflict with an empty holder: tcd
  --    retries that item at once (the keys another item of this batch took
  --    may be given back in step 5).  A key the same xid holds (another of
  --    its branches) is not a conflict.
  IF v_taken < v_wanted THEN
  SELECT coalesce(array_agg(c.it), '{}'), coalesce(array_agg(c.hx), '{}'),
         coalesce(array_agg(c.hs), '{}')
    INTO v_conflict, v_holder, v_holder_status
    FROM (SELECT DISTINCT ON (l.it) l.it, lt.xid AS hx, lt.status AS hs
            FROM unnest(l_item, l_row) AS l(it, r)
            LEFT JOIN lock_table lt ON lt.row_key = l.r AND NOT (lt.branch_id = ANY (p_branch))
           WHERE l.it = ANY (v_active) AND NOT (l.it = ANY (v_dup))
             AND NOT EXISTS (SELECT 1 FROM lock_table mine
                              WHERE mine.row_key = l.r AND mine.branch_id = p_branch[l.it])
             AND (lt.xid IS NULL OR lt.xid <> p_xid[l.it])
           ORDER BY l.it, lt.status DESC NULLS LAST) c;
  END IF;

  -- 5. A conflicting item gives back the keys it took.
  IF cardinality(v_conflict) > 0 THEN
    DELETE FROM lock_table lt
     USING unnest(v_conflict) AS c(i)
     WHERE lt.xid = p_xid[c.i] AND lt.branch_id = p_branch[c.i];
  END IF;
  END IF;

  -- 6. Branch rows of the items that got all their keys.
  INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, branch_type, status,
                            lock_keys, application_data, client_id, idem_key, application_id,
                            app_group)
  SELECT u.b, u.x, v_txid[u.i], u.r, u.ty, 1, u.lk, u.ad, u.cl, u.k, u.ap, u.gr
    FROM unnest(p_xid, p_branch, p_resource, p_type, p_lock_keys, p_app_data, p_client, p_idem,
                p_app, p_group)
         WITH ORDINALITY AS u(x, b, r, ty, lk, ad, cl, k, ap, gr, i)
   WHERE u.i = ANY (v_active) AND NOT (u.i = ANY (v_dup)) AND NOT (u.i = ANY (v_conflict));

  -- 7. One row per item; from memory in the usual case (every item was
  --    active and got its keys).
  IF cardinality(v_active) = cardinality(p_xid) AND cardinality(v_dup) = 0
     AND cardinality(v_conflict) = 0 THEN
    RETURN QUERY SELECT u.i::int, 'ok'::text, u.b, NULL::text, NULL::smallint
                   FROM unnest(p_branch) WITH ORDINALITY AS u(b, i) ORDER BY u.i;
    RETURN;
  END IF;
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN gt.xid IS NULL THEN 'not_found'
              WHEN u.i = ANY (v_denied) THEN 'not_owner'
              WHEN NOT (u.i = ANY (v_active)) AND gt.status <> 1 THEN 'not_active'
              WHEN NOT (u.i = ANY (v_active)) THEN 'timed_out'
              WHEN u.i = ANY (v_dup) THEN 'ok'
              WHEN u.i = ANY (v_conflict) THEN
                CASE WHEN v_holder_status[array_position(v_conflict, u.i::int)] = 1
                     THEN 'holder_rollbacking' ELSE 'conflict' END
              ELSE 'ok' END,
         CASE WHEN u.i = ANY (v_dup) THEN v_dup_branch[array_position(v_dup, u.i::int)]
              WHEN u.i = ANY (v_active) AND NOT (u.i = ANY (v_conflict)) THEN u.b END,
         CASE WHEN u.i = ANY (v_conflict) THEN v_holder[array_position(v_conflict, u.i::int)] END,
         CASE WHEN u.i = ANY (v_conflict) THEN v_holder_status[array_position(v_conflict, u.i::int)]
              WHEN NOT (u.i = ANY (v_active)) AND NOT (u.i = ANY (v_denied)) THEN gt.status END
    FROM unnest(p_xid, p_branch) WITH ORDINALITY AS u(x, b, i)
    LEFT JOIN global_table gt ON gt.xid = u.x
   ORDER BY u.i;
END $$;

ALTER FUNCTION tc_begin_batch(text[], bigint[], integer[], text[], text[], text[], text[], integer)
  SET enable_seqscan = off;
ALTER FUNCTION tc_decide_lock(text[]) SET enable_seqscan = off;
ALTER FUNCTION tc_decide_batch(text[], text[], text[], text[], integer) SET enable_seqscan = off;
ALTER FUNCTION tc_phase2_batch(text[], bigint[], smallint[], text[], text[], text[], text[], integer, integer)
  SET enable_seqscan = off;
