-- sql/tc/004_admin.sql - operator repairs behind tcd's admin socket (tcctl).
--
-- NOTES
--   tcd plans a repair in C from the stored state (tc/tc_admin_cmd.c checks
--   it against proto/txp_status.h: txp_global_transition_ok, and never a
--   move across the commit/rollback families), then applies it with one of
--   these functions.  Each is a compare-and-set under the global row's lock
--   (FOR UPDATE, the lock tc_decide_batch and tc_phase2_batch take first),
--   so a repair and a phase-two outcome of the same xid are serialised, and
--   a repair planned from a state that changed meanwhile changes nothing.
--   Decisions from Begin do not come here: they go through tc_decide_batch
--   like a TM's, with the same lock handling.
--
--   Results ("result" column): ok, not_found (no live row; "status" is the
--   history status or 0), changed (the status is no longer p_from;
--   "status" is the current one), branch (a branch in a status of p_forbid
--   exists: "branch_id"/"branch_status" name it), live (delete: the
--   session is not finished).

-- Set the status of p_xid from p_from to p_to (p_to may equal p_from: only
-- next_retry_at changes), unless a branch is in one of p_forbid.
-- p_retry: 'lease' (the node drives now; recovery stays away p_lease_ms),
-- 'now' (due at once for the leader's retry job), 'clear' (no retry).
CREATE FUNCTION tc_admin_cas(p_xid text, p_from smallint, p_to smallint, p_retry text,
                             p_lease_ms int, p_forbid smallint[])
RETURNS TABLE (result text, status smallint, branch_id bigint, branch_status smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_status smallint;
  v_branch bigint;
  v_bstatus smallint;
BEGIN
  IF p_retry NOT IN ('lease', 'now', 'clear') THEN
    RAISE EXCEPTION 'tc_admin_cas: unknown retry mode "%"', p_retry USING ERRCODE = '22023';
  END IF;
  SELECT g.status INTO v_status FROM global_table g WHERE g.xid = p_xid FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'not_found'::text,
                        coalesce((SELECT h.status FROM global_history h WHERE h.xid = p_xid), 0::smallint),
                        NULL::bigint, NULL::smallint;
    RETURN;
  END IF;
  IF v_status <> p_from THEN
    RETURN QUERY SELECT 'changed'::text, v_status, NULL::bigint, NULL::smallint;
    RETURN;
  END IF;
  SELECT b.branch_id, b.status INTO v_branch, v_bstatus
    FROM branch_table b
   WHERE b.xid = p_xid AND b.status = ANY (p_forbid)
   ORDER BY b.branch_id LIMIT 1;
  IF FOUND THEN
    RETURN QUERY SELECT 'branch'::text, v_status, v_branch, v_bstatus;
    RETURN;
  END IF;
  UPDATE global_table g
     SET status = p_to,
         gmt_modified = clock_timestamp(),
         next_retry_at = CASE p_retry WHEN 'clear' THEN NULL
                                      WHEN 'now' THEN clock_timestamp()
                                      ELSE clock_timestamp() + p_lease_ms * interval '1 millisecond' END
   WHERE g.xid = p_xid AND g.status = p_from;
  RETURN QUERY SELECT 'ok'::text, p_to, NULL::bigint, NULL::smallint;
END $$;

COMMENT ON FUNCTION tc_admin_cas(text, smallint, smallint, text, int, smallint[]) IS
  'Operator repair (tcctl): compare-and-set of a global status, refused when a '
  'branch is in a forbidden status. See sql/tc/004_admin.sql.';

-- Delete what a finished (or never known) global transaction left behind:
-- its lock rows and branch rows.  Refused ('live') while the session is in
-- global_table.  'not_found' when there is neither history nor leftovers.
CREATE FUNCTION tc_admin_delete_leftovers(p_xid text)
RETURNS TABLE (result text, status smallint, locks bigint, branches bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_status smallint;
  v_locks bigint;
  v_branches bigint;
BEGIN
  -- A live session is locked first, exactly as the other writers do, so a
  -- session that is being finished right now is seen either live or gone.
  SELECT g.status INTO v_status FROM global_table g WHERE g.xid = p_xid FOR UPDATE;
  IF FOUND THEN
    RETURN QUERY SELECT 'live'::text, v_status, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  WITH d AS (DELETE FROM lock_table l WHERE l.xid = p_xid RETURNING 1)
  SELECT count(*) INTO v_locks FROM d;
  WITH d AS (DELETE FROM branch_table b WHERE b.xid = p_xid RETURNING 1)
  SELECT count(*) INTO v_branches FROM d;
  SELECT h.status INTO v_status FROM global_history h WHERE h.xid = p_xid;
  IF NOT FOUND AND v_locks = 0 AND v_branches = 0 THEN
    RETURN QUERY SELECT 'not_found'::text, 0::smallint, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  RETURN QUERY SELECT 'ok'::text, coalesce(v_status, 0::smallint), v_locks, v_branches;
END $$;

COMMENT ON FUNCTION tc_admin_delete_leftovers(text) IS
  'Operator repair (tcctl delete): remove lock and branch rows of a global '
  'transaction that is no longer live. See sql/tc/004_admin.sql.';
