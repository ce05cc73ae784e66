-- sql/tc/015_compact_history.sql - a finished global's branches as short
-- arrays in its history row (coordinator database, version 15).
--
-- Issue 23 counts the store's WAL per order with pg_walinspect
-- (bench/README.md, "Twenty-first session").  One entry was larger than
-- what it holds:
--
--   * global_history.branches.  tc__finish_many wrote each branch as an
--     object, {"status": 5, "branch_id": 65650, "branch_type": 0,
--     "resource_id": "orders"}: jsonb stores the four key names in every
--     object, and a two-branch order's list took 231 bytes of its history
--     row.  New rows hold [branch_id, resource_id, branch_type, status]
--     per branch: 120 bytes for the same two branches, and less work for
--     the finishing statement (which also finds each global's status in
--     one sort of the list instead of a scan of it per global).  Rows
--     written before this version keep their objects.  Readers go through
--     two functions that take either form, so nobody parses the column
--     itself:
--       tc_history_branches(branches)   the objects, as before;
--       tc_history_has_branch(branches, id)   is the branch among them?
--
-- A tcd of version 14 or older running against this schema reads the new
-- history rows' branches as arrays: tcctl shows them as they are, and a
-- late phase-two report about a branch of such a row is answered "branch
-- not found".  Upgrade the nodes right after the schema.
--
-- test_schema.sh checks the history of a finished global in both forms.
--
-- Never edit this file after it has shipped: add sql/tc/016_*.sql instead.

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
    -- an xid listed twice keeps its first status: one sort of the list,
    -- not a scan of it per finished global
    JOIN (SELECT DISTINCT ON (u.x) u.x, u.s FROM unnest(p_xid, p_status) WITH ORDINALITY AS u(x, s, i)
           ORDER BY u.x, u.i) f ON f.x = g.xid
    LEFT JOIN LATERAL (
      SELECT jsonb_agg(jsonb_build_array(b.branch_id, b.resource_id, b.branch_type,
                                         coalesce(p_branch_status, b.status))
                       ORDER BY b.branch_id) AS branches
        FROM branch_table b WHERE b.xid = g.xid) br ON true;
END $$;

-- The branches of a history row as objects with named members, whichever
-- form the row holds (before version 15: objects; since: arrays).
CREATE FUNCTION tc_history_branches(p_branches jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(jsonb_agg(CASE WHEN jsonb_typeof(x.e) = 'array'
                                 THEN jsonb_build_object('branch_id', x.e -> 0, 'resource_id', x.e -> 1,
                                                         'branch_type', x.e -> 2, 'status', x.e -> 3)
                                 ELSE x.e END
                            ORDER BY x.o), '[]'::jsonb)
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(p_branches) = 'array' THEN p_branches
                                   ELSE '[]'::jsonb END) WITH ORDINALITY AS x(e, o)
$$;
COMMENT ON FUNCTION tc_history_branches(jsonb) IS
  'global_history.branches as objects {branch_id, resource_id, branch_type, status}, from either stored form (sql/tc/015_compact_history.sql).';

-- Is branch p_branch among a history row's branches (either form)?
CREATE FUNCTION tc_history_has_branch(p_branches jsonb, p_branch bigint) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT jsonb_typeof(p_branches) = 'array'
         AND EXISTS (SELECT 1 FROM jsonb_array_elements(p_branches) AS x(e)
                      WHERE coalesce(x.e -> 0, x.e -> 'branch_id') = to_jsonb(p_branch))
$$;
COMMENT ON FUNCTION tc_history_has_branch(jsonb, bigint) IS
  'Whether a branch id is among global_history.branches, in either stored form (sql/tc/015_compact_history.sql).';

COMMENT ON COLUMN global_history.branches IS
  'The branches when the transaction finished, in branch id order: since version 15 one array [branch_id, resource_id, branch_type, status] per branch, before it one object with those members.  Read it through tc_history_branches() (objects) or tc_history_has_branch().';
