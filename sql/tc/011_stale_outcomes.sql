-- sql/tc/011_stale_outcomes.sql - phase-two outcomes that come too late
-- (coordinator database, version 11).
--
-- Two drives of one global may run at once: recovery claims a global in
-- phase two when its lease (next_retry_at) has run out, and a drive that
-- runs longer than the lease (a saga of slow steps, a paused node) is still
-- going when the second one starts.  Phase two is idempotent at the RMs
-- (the undo row, the fence), so two drives of one direction are harmless.
-- But a saga changes direction: when an action fails for good the global
-- turns to Rollbacking (009_saga.sql), and the other drive's answers are
-- then those of a commit that is no longer going on.  model/saga.pml finds
-- what they did to the store (model/README.md has the traces):
--
--   * an action refused because its step was compensated first (RM_E_FENCE,
--     7) counted as a failed rollback: RollbackFailed, an operator called,
--     for a saga whose compensations all went through;
--   * a stale "failed for good" of a step whose action another call had
--     meanwhile run (the fence's serialised second delivery) turned a saga
--     that had committed its steps, while the other drive confirmed its
--     TCC branches: a cancel refused, RollbackFailed with a confirm in.
--
-- The rules of tc_phase2_batch gain one: an outcome that is stale is not
-- recorded (neither the branch's status nor the global's), and is answered
-- 'ok' with the global's status, from which the drive learns the direction
-- it is in (tc/tc_phase2.c stops a drive whose direction is no longer the
-- global's).  Stale is:
--
--   * a phase-two outcome against the global's direction: a commit outcome
--     (5, 6, 7) of a global in the rollback or timeout family, a rollback
--     outcome (8, 9, 10) of one in the commit family (a commit drive's, or
--     the all-branches op of one, after the turn);
--   * a failure of a direction over the status a branch finished with in
--     it: 6 or 7 over 5, 9 or 10 over 8 (a call that timed out or failed
--     before another call of the branch went through: phase two done is
--     done, and a later failure report of it is older news).
--
-- The same outcome again (5 over 5, 8 over 8: the drive that records the
-- last finished branch once more so that the store finishes the session)
-- is not stale.
--
-- Never edit this file after it has shipped: add sql/tc/012_*.sql instead.

CREATE OR REPLACE FUNCTION tc_phase2_batch(p_xid text[], p_branch bigint[], p_status smallint[],
                                p_error text[], p_app text[], p_client text[], p_group text[],
                                p_retry_min_ms int, p_retry_max_ms int)
RETURNS TABLE (item int, result text, global_status smallint, finished boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_present text[];  -- xids found (not yet finished) when the batch began
  v_missing int[];   -- items naming a branch that does not exist
  v_denied int[];    -- reports of a branch by another RM than the one that registered it
  v_x text[];        -- per xid in phase two: family and outcome of this batch
  v_fam text[];
  v_unr boolean[];
  v_ret boolean[];
  v_err text[];
  v_final text[];    -- xids finished by this batch, and their final status
  v_final_status smallint[];
  v_comp text[];     -- sagas this batch turned to compensation
  v_stale int[];     -- outcomes that come too late: not recorded (010)
BEGIN
  -- Fast path, the common case of a healthy commit: every item says "all
  -- branches of this commit-family transaction committed".  Finish them
  -- without touching the branch rows one by one.
  IF p_branch <@ ARRAY[0::bigint] AND p_status <@ ARRAY[5::smallint] THEN
    SELECT coalesce(array_agg(l.xid), '{}') INTO v_final
      FROM (SELECT gt.xid, gt.status FROM global_table gt
             WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR UPDATE) l
     WHERE l.status IN (2, 3, 8);
    IF cardinality(v_final) = (SELECT count(DISTINCT x) FROM unnest(p_xid) AS x) THEN
      PERFORM tc__finish_many(v_final, array_fill(9::smallint, ARRAY[cardinality(v_final)]),
                              5::smallint);
      RETURN QUERY SELECT u.i::int, 'ok'::text, 9::smallint, true
                     FROM unnest(p_xid) WITH ORDINALITY AS u(x, i) ORDER BY u.i;
      RETURN;
    END IF;
  END IF;

  PERFORM 1 FROM global_table gt WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR UPDATE;
  SELECT coalesce(array_agg(gt.xid), '{}') INTO v_present
    FROM global_table gt WHERE gt.xid = ANY (p_xid);

  -- Items naming a branch that does not exist, and (010) stale outcomes:
  -- against the global's direction, or a failure over the status the
  -- branch finished with in that direction (this file's header); in the
  -- one statement that found the missing ones before.
  SELECT coalesce(array_agg(u.i::int) FILTER (WHERE u.b <> 0 AND b.branch_id IS NULL), '{}'),
         coalesce(array_agg(u.i::int) FILTER (
           WHERE (u.b = 0 OR b.branch_id IS NOT NULL)
             AND ((u.s IN (5, 6, 7) AND g.status IN (4, 5, 6, 7, 13, 14))
                  OR (u.s IN (8, 9, 10) AND g.status IN (2, 3, 8, 10))
                  OR (u.s IN (6, 7) AND b.status = 5)
                  OR (u.s IN (9, 10) AND b.status = 8))), '{}')
    INTO v_missing, v_stale
    FROM unnest(p_xid, p_branch, p_status) WITH ORDINALITY AS u(x, b, s, i)
    JOIN global_table g ON g.xid = u.x
    LEFT JOIN branch_table b ON b.branch_id = u.b AND b.xid = u.x;

  -- A branch report (p_app given) is taken only from the RM that registered
  -- the branch: its application and client id.  (Branches registered before
  -- version 8 have no application: then its group suffices.)
  v_denied := '{}';
  IF cardinality(array_remove(p_app, NULL)) > 0 THEN
    SELECT coalesce(array_agg(u.i::int), '{}') INTO v_denied
      FROM unnest(p_xid, p_branch, p_app, p_client, p_group) WITH ORDINALITY AS u(x, b, ap, cl, gr, i)
      JOIN branch_table b ON b.branch_id = u.b AND b.xid = u.x
      JOIN global_table g ON g.xid = u.x
     WHERE u.ap IS NOT NULL
       AND NOT CASE WHEN b.application_id IS NULL THEN g.app_group IS NOT DISTINCT FROM u.gr
                    ELSE b.application_id = u.ap AND b.client_id IS NOT DISTINCT FROM u.cl END;
    v_missing := v_missing || v_denied;
  END IF;

  -- A phase-one report (2, 3) is recorded only while the branch is still in
  -- phase one: a late or repeated one never overwrites a phase-two outcome.
  UPDATE branch_table b
     SET status = u.s, last_error = u.e, gmt_modified = clock_timestamp()
    FROM unnest(p_xid, p_branch, p_status, p_error) WITH ORDINALITY AS u(x, br, s, e, i)
   WHERE b.xid = u.x AND (b.branch_id = u.br OR u.br = 0)
     AND (u.s NOT IN (2, 3) OR b.status IN (1, 2, 3))
     AND NOT (u.i = ANY (v_denied)) AND NOT (u.i = ANY (v_stale));

  -- Saga: a step whose action failed for good, in a saga still going
  -- forward, turns the global to its compensation (Rollbacking).  Only
  -- a batch that reports a commit failed for good (7) looks: the others
  -- pay one array test.
  v_comp := '{}';
  IF 7::smallint = ANY (p_status) THEN
  WITH failed AS (
    SELECT DISTINCT ON (u.x) u.x, u.e
      FROM unnest(p_xid, p_branch, p_status, p_error) WITH ORDINALITY AS u(x, br, s, e, i)
      JOIN branch_table b ON b.xid = u.x AND b.branch_id = u.br AND b.branch_type = 2
      JOIN global_table g ON g.xid = u.x
     WHERE u.s = 7 AND g.status IN (2, 3, 8) AND NOT (u.i = ANY (v_missing))
       AND NOT (u.i = ANY (v_stale))
     ORDER BY u.x, u.i),
  turned AS (
    UPDATE global_table g
       SET status = 4, last_error = f.e, retry_count = 0, gmt_modified = clock_timestamp()
      FROM failed f
     WHERE g.xid = f.x
    RETURNING g.xid)
  SELECT coalesce(array_agg(t.xid), '{}') INTO v_comp FROM turned t;
  END IF;

  SELECT coalesce(array_agg(s.x), '{}'), coalesce(array_agg(s.fam), '{}'),
         coalesce(array_agg(s.unr), '{}'), coalesce(array_agg(s.ret), '{}'),
         coalesce(array_agg(s.err), '{}')
    INTO v_x, v_fam, v_unr, v_ret, v_err
    FROM (SELECT u.x,
                 CASE WHEN g.status IN (2, 3, 8, 10) THEN 'commit'
                      WHEN g.status IN (4, 5, 13) THEN 'rollback'
                      WHEN g.status IN (6, 7, 14) THEN 'timeout' END AS fam,
                 bool_or(u.s IN (7, 10)) AS unr, bool_or(u.s IN (6, 9)) AS ret,
                 (array_agg(u.e ORDER BY (u.s IN (7, 10)) DESC, (u.s IN (6, 9)) DESC)
                    FILTER (WHERE u.e IS NOT NULL))[1] AS err
            FROM unnest(p_xid, p_status, p_error) WITH ORDINALITY AS u(x, s, e, i)
            JOIN global_table g ON g.xid = u.x
           WHERE NOT (u.i = ANY (v_missing)) AND NOT (u.i = ANY (v_stale))
             AND NOT (u.x = ANY (v_comp))
           GROUP BY u.x, g.status) s
   WHERE s.fam IS NOT NULL;

  -- Failures: unretryable -> *Failed (locks kept, for an operator);
  -- retryable -> *Retrying with exponential backoff.
  UPDATE global_table g
     SET status = CASE WHEN p.unr THEN
                    CASE p.fam WHEN 'commit' THEN 10 WHEN 'rollback' THEN 13 ELSE 14 END
                  ELSE CASE p.fam WHEN 'commit' THEN 3 WHEN 'rollback' THEN 5 ELSE 7 END END,
         last_error = p.err,
         retry_count = g.retry_count + CASE WHEN p.unr THEN 0 ELSE 1 END,
         next_retry_at = CASE WHEN p.unr THEN NULL ELSE
                           clock_timestamp() + least(p_retry_max_ms::double precision,
                             p_retry_min_ms * power(2::double precision, least(g.retry_count, 20)))
                             * interval '1 millisecond' END,
         gmt_modified = clock_timestamp()
    FROM unnest(v_x, v_fam, v_unr, v_ret, v_err) AS p(x, fam, unr, ret, err)
   WHERE g.xid = p.x AND (p.unr OR p.ret);

  -- Done: no unfinished branch left -> final status, history, rows gone.
  SELECT coalesce(array_agg(p.x), '{}'),
         coalesce(array_agg(CASE p.fam WHEN 'commit' THEN 9 WHEN 'rollback' THEN 11
                                       ELSE 12 END::smallint), '{}')
    INTO v_final, v_final_status
    FROM unnest(v_x, v_fam, v_unr, v_ret) AS p(x, fam, unr, ret)
   WHERE NOT p.unr AND NOT p.ret
     AND NOT EXISTS (SELECT 1 FROM branch_table b
                      WHERE b.xid = p.x
                        AND (b.status NOT IN (5, 8)
                             OR (p.fam <> 'commit' AND b.branch_type = 2 AND b.status = 5)));
  IF cardinality(v_final) > 0 THEN
    PERFORM tc__finish_many(v_final, v_final_status);
  END IF;

  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN NOT (u.x = ANY (v_present)) THEN 'not_found'
              WHEN u.i = ANY (v_denied) THEN 'not_owner'
              WHEN u.i = ANY (v_missing) THEN 'branch_not_found'
              WHEN u.x = ANY (v_final) THEN 'ok'
              WHEN u.x = ANY (v_comp) THEN 'compensate'
              WHEN coalesce(v_unr[array_position(v_x, u.x)], false) THEN 'failed'
              WHEN coalesce(v_ret[array_position(v_x, u.x)], false) THEN 'retry'
              ELSE 'ok' END,
         CASE WHEN u.x = ANY (v_final) THEN v_final_status[array_position(v_final, u.x)]
              ELSE coalesce(g.status, 0::smallint) END,
         u.x = ANY (v_final)
    FROM unnest(p_xid) WITH ORDINALITY AS u(x, i)
    LEFT JOIN global_table g ON g.xid = u.x
   ORDER BY u.i;
END $$;
