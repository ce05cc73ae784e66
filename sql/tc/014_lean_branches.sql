-- sql/tc/014_lean_branches.sql - a branch costs one index entry, and a
-- registration that begins its global does not lock it (coordinator
-- database, version 14).
--
-- Issue 23 counts the store's WAL per order with pg_walinspect
-- (bench/README.md, "Seventeenth session").  Two parts of it bought
-- nothing:
--
--   * Two indexes per branch row.  branch_table had its primary key on
--     branch_id and a unique constraint on (xid, idem_key), but every
--     statement finds branches by xid (and branch_id within it), and most
--     registrations carry no idempotency key.  Now the primary key is
--     (xid, branch_id): it serves every lookup, and a registration run
--     again after its first run committed still meets a unique violation
--     (tc_store.c reads the store then).  The idempotency keys keep their
--     unique index, for the rows that have one only.  About 130 bytes of
--     WAL per order, and one index less to maintain on every insert.
--
--   * A share lock on a global begun in the same transaction.  A
--     registration that begins its global (tc_store.c begin_parts) inserts
--     the global and then share-locks it; a row lock is a WAL record (about
--     55 bytes), and no other transaction can see, so decide, a row this
--     one has not committed.  tc_register_batch now locks only the globals
--     that another transaction inserted (xmin).  Everything else is 008's
--     function as it was.
--
-- branch_table holds the unfinished branches only (a few hundred rows), so
-- rebuilding its keys takes a moment.  test_schema.sh checks both.
--
-- Never edit this file after it has shipped: add sql/tc/015_*.sql instead.

ALTER TABLE branch_table DROP CONSTRAINT branch_table_pkey;
ALTER TABLE branch_table ADD CONSTRAINT branch_table_pkey PRIMARY KEY (xid, branch_id);
ALTER TABLE branch_table DROP CONSTRAINT branch_table_xid_idem_key_key;
CREATE UNIQUE INDEX branch_table_xid_idem_key_key ON branch_table (xid, idem_key) WHERE idem_key IS NOT NULL;

COMMENT ON COLUMN branch_table.branch_id IS
  'Branch id from tc_id_seq; unique across nodes.  With xid the primary key (sql/tc/014_lean_branches.sql).';
COMMENT ON COLUMN branch_table.xid IS
  'Global transaction (global_table.xid); the leading column of the primary key (xid, branch_id).';
COMMENT ON COLUMN branch_table.idem_key IS
  'Optional idempotency key of BranchRegister, unique per xid (a partial unique index over the rows that have one): a retried register returns the existing branch_id. NULL = none.';

CREATE OR REPLACE FUNCTION tc_register_batch(p_xid text[], p_branch bigint[], p_resource text[],
                                  p_type smallint[], p_lock_keys text[], p_app_data text[],
                                  p_client text[], p_idem text[], p_app text[], p_group text[],
                                  l_item int[], l_row text[], l_table text[], l_pk text[])
RETURNS TABLE (item int, result text, branch_id bigint, holder text, holder_status smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_active int[];     -- items whose global is Begin, not past its deadline, of their group
  v_denied int[];     -- items whose global another group began
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
  --    in it (p_group NULL: not checked).
  WITH shared AS (SELECT gt.xid, gt.status, gt.deadline, gt.app_group FROM global_table gt
                   WHERE gt.xid = ANY (p_xid) AND gt.xmin <> v_me ORDER BY gt.xid FOR SHARE)
  SELECT coalesce(array_agg(u.i::int) FILTER (WHERE (u.gr IS NULL OR g.app_group = u.gr)
                                                AND g.status = 1 AND g.deadline >= clock_timestamp()),
                  '{}'),
         coalesce(array_agg(u.i::int) FILTER (WHERE u.gr IS NOT NULL AND g.app_group IS DISTINCT FROM u.gr),
                  '{}')
    INTO v_active, v_denied
    FROM unnest(p_xid, p_group) WITH ORDINALITY AS u(x, gr, i)
    JOIN (SELECT gt.xid, gt.status, gt.deadline, gt.app_group FROM global_table gt
           WHERE gt.xid = ANY (p_xid) AND gt.xmin = v_me
          UNION ALL
          SELECT s.xid, s.status, s.deadline, s.app_group FROM shared s) g ON g.xid = u.x;

  -- 2. Repeated idempotency keys (none to look for when no item has one).
  v_dup := '{}';
  v_dup_branch := '{}';
  IF cardinality(array_remove(p_idem, NULL)) > 0 THEN
    SELECT coalesce(array_agg(u.i::int), '{}'), coalesce(array_agg(b.branch_id), '{}')
      INTO v_dup, v_dup_branch
      FROM unnest(p_xid, p_idem) WITH ORDINALITY AS u(x, k, i)
      JOIN branch_table b ON b.xid = u.x AND b.idem_key = u.k
     WHERE u.i = ANY (v_active);
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
    SELECT w.r, p_xid[w.it], gt.transaction_id, p_branch[w.it], p_resource[w.it], w.t, w.p
      FROM want w
      JOIN global_table gt ON gt.xid = p_xid[w.it]
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
  SELECT u.b, u.x, gt.transaction_id, u.r, u.ty, 1, u.lk, u.ad, u.cl, u.k, u.ap, u.gr
    FROM unnest(p_xid, p_branch, p_resource, p_type, p_lock_keys, p_app_data, p_client, p_idem,
                p_app, p_group)
         WITH ORDINALITY AS u(x, b, r, ty, lk, ad, cl, k, ap, gr, i)
    JOIN global_table gt ON gt.xid = u.x
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

