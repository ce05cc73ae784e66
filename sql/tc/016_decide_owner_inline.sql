-- sql/tc/016_decide_owner_inline.sql - a decision by the application that
-- began its global checks ownership without a function call (coordinator
-- database, version 16).
--
-- tc_decide_batch filtered every item with tc__may_decide (008), the
-- ownership rule.  That function cannot be inlined by the planner (its
-- body holds an EXISTS over branch_table), so each item paid a call of a
-- SQL function: auto_explain showed 0.5 ms of a 0.9 ms batch of 20
-- commits in that join filter (bench/README.md, "Twenty-first session").
-- The usual caller is the application that began the global, one case of
-- the rule (same group, same application); that case, and the
-- coordinator's own decisions (no group), are now tested inline, and the
-- function runs only when both fail.  The rule is unchanged and
-- still lives in tc__may_decide alone: the inline test only implies it.
-- Everything else is 010's function as it was; test_schema.sh and
-- test_tcd_authz check the rule's answers.
--
-- Never edit this file after it has shipped: add sql/tc/017_*.sql instead.

CREATE OR REPLACE FUNCTION tc_decide_batch(p_xid text[], p_action text[], p_app text[], p_group text[],
                                           p_lease_ms integer)
  RETURNS TABLE(item integer, result text, status smallint)
  LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_items int[];      -- the item that decided each xid
  v_status smallint[];-- the status it set
  v_branches boolean[];
  v_timed_out boolean[];
BEGIN
  PERFORM 1 FROM global_table gt WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR UPDATE;

  WITH firsts AS (
    SELECT DISTINCT ON (u.x) u.x, u.a, u.i::int AS i
      FROM unnest(p_xid, p_action, p_app, p_group) WITH ORDINALITY AS u(x, a, ap, gr, i)
      JOIN global_table g ON g.xid = u.x
     -- Two cases of the rule are tested inline: the coordinator itself (no
     -- group) and the application that began the global, the usual caller.
     -- tc__may_decide (a function call per row) only for the others.
     WHERE (u.gr IS NULL OR (g.app_group = u.gr AND g.application_id = u.ap)
            OR tc__may_decide(g.xid, g.application_id, g.app_group, u.ap, u.gr))
     ORDER BY u.x, (u.a = 'timeout'), u.i),
  plan0 AS (
    SELECT f.x, f.i, (f.a = 'commit' AND g.deadline < clock_timestamp()) AS late,
           CASE WHEN f.a = 'commit' AND g.deadline < clock_timestamp() THEN 'timeout'
                ELSE f.a END AS act,
           br.n > 0 AS has_branches, coalesce(br.at_only, true) AS at_only
      FROM firsts f JOIN global_table g ON g.xid = f.x
      -- one look at the branches for both answers
      CROSS JOIN LATERAL (
        SELECT count(*) AS n,
               bool_and(b.branch_type = 0
                        AND b.application_data IS DISTINCT FROM 'txc:phase2=sync') AS at_only
          FROM branch_table b WHERE b.xid = f.x) br
     WHERE g.status = 1 AND (f.a <> 'timeout' OR g.deadline < clock_timestamp())),
  plan AS (
    SELECT p.*, (p.act = 'commit' AND p.has_branches AND p.at_only) AS now FROM plan0 p),
  upd AS (
    UPDATE global_table g
       SET status = CASE WHEN p.has_branches THEN
                      CASE p.act WHEN 'commit' THEN 8 WHEN 'rollback' THEN 4 ELSE 6 END
                    ELSE CASE p.act WHEN 'commit' THEN 9 WHEN 'rollback' THEN 11 ELSE 12 END END,
           gmt_modified = clock_timestamp(),
           next_retry_at = CASE WHEN p.has_branches
                                THEN clock_timestamp() + p_lease_ms * interval '1 millisecond' END
      FROM plan p
     WHERE g.xid = p.x AND g.status = 1 AND NOT p.now
    RETURNING p.i, g.status, p.has_branches, p.late),
  decided AS (
    SELECT upd.i, upd.status, upd.has_branches, upd.late FROM upd
    UNION ALL
    SELECT p.i, 9::smallint, true, false FROM plan p WHERE p.now)
  SELECT coalesce(array_agg(d.i), '{}'), coalesce(array_agg(d.status), '{}'),
         coalesce(array_agg(d.has_branches), '{}'), coalesce(array_agg(d.late), '{}')
    INTO v_items, v_status, v_branches, v_timed_out
    FROM decided d;

  -- Commit releases the locks now; rollback marks them rollbacking.  (Each
  -- statement only when it has work.)
  IF 8 = ANY (v_status) THEN
    DELETE FROM lock_table lt
     WHERE lt.xid = ANY (SELECT p_xid[d.i] FROM unnest(v_items, v_status) AS d(i, s) WHERE d.s = 8);
  END IF;
  IF 4 = ANY (v_status) OR 6 = ANY (v_status) THEN
    UPDATE lock_table lt SET status = 1
     WHERE lt.xid = ANY (SELECT p_xid[d.i] FROM unnest(v_items, v_status) AS d(i, s) WHERE d.s IN (4, 6));
  END IF;
  -- Without branches there is nothing to drive: finished now.
  IF false = ANY (v_branches) THEN
    PERFORM tc__finish_many(array_agg(p_xid[d.i]), array_agg(d.s))
       FROM unnest(v_items, v_status, v_branches) AS d(i, s, hb) WHERE NOT d.hb;
  END IF;
  -- AT commits without commit work: finished now too, their branches
  -- recorded PhaseTwoCommitted (5) in the history (its locks go with it).
  IF 9 = ANY (v_status) AND true = ANY (v_branches) THEN
    PERFORM tc__finish_many(array_agg(p_xid[d.i]), array_agg(d.s), 5::smallint)
       FROM unnest(v_items, v_status, v_branches) AS d(i, s, hb) WHERE d.hb AND d.s = 9;
  END IF;

  IF cardinality(v_items) = cardinality(p_xid) THEN
    RETURN QUERY
    SELECT d.i, CASE WHEN d.late THEN 'timed_out' ELSE 'ok' END, d.s
      FROM unnest(v_items, v_status, v_timed_out) AS d(i, s, late) ORDER BY d.i;
    RETURN;
  END IF;
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN u.i = ANY (v_items) THEN
                CASE WHEN v_timed_out[array_position(v_items, u.i::int)] THEN 'timed_out' ELSE 'ok' END
              WHEN g.xid IS NOT NULL AND NOT tc__may_decide(g.xid, g.application_id, g.app_group, u.ap, u.gr)
                THEN 'not_owner'
              WHEN g.xid IS NULL AND h.xid IS NOT NULL AND u.gr IS NOT NULL
                   AND h.app_group IS DISTINCT FROM u.gr THEN 'not_owner'
              WHEN g.status = 1 THEN 'not_expired'
              WHEN g.xid IS NOT NULL THEN 'decided'
              WHEN h.xid IS NOT NULL THEN 'finished'
              ELSE 'not_found' END,
         CASE WHEN u.i = ANY (v_items) THEN v_status[array_position(v_items, u.i::int)]
              WHEN g.xid IS NOT NULL AND NOT tc__may_decide(g.xid, g.application_id, g.app_group, u.ap, u.gr)
                THEN 0::smallint
              WHEN g.xid IS NULL AND h.xid IS NOT NULL AND u.gr IS NOT NULL
                   AND h.app_group IS DISTINCT FROM u.gr THEN 0::smallint
              ELSE coalesce(g.status, h.status, 0::smallint) END
    FROM unnest(p_xid, p_app, p_group) WITH ORDINALITY AS u(x, ap, gr, i)
    LEFT JOIN global_table g ON g.xid = u.x
    LEFT JOIN global_history h ON g.xid IS NULL AND h.xid = u.x
   ORDER BY u.i;
END $$;

