-- sql/tc/002_functions.sql - the coordinator's store operations, set-based.
--
-- NOTES
--   tcd batches the requests of many sessions into one PostgreSQL
--   transaction (group commit): each function below takes arrays (one
--   element per request, "item" 1..n) and returns one row per item, so a
--   batch of 200 registrations costs one round trip and one fsync, not 200.
--   Each item's outcome is a short word in "result" that tcd maps to its
--   protocol error codes (proto/txp_errno.h):
--     ok, not_found, not_active, timed_out, conflict, holder_rollbacking,
--     decided, finished, not_expired, branch_not_found, failed, retry.
--   Status numbers are Seata's (proto/txp_status.h):
--     global: 1 Begin, 4 Rollbacking, 5 RollbackRetrying, 6 TimeoutRollbacking,
--             7 TimeoutRollbackRetrying, 8 AsyncCommitting, 3 CommitRetrying,
--             9 Committed, 10 CommitFailed, 11 Rollbacked, 12 TimeoutRollbacked,
--             13 RollbackFailed, 14 TimeoutRollbackFailed
--     branch: 1 Registered, 2 PhaseOneDone, 3 PhaseOneFailed,
--             5 PhaseTwoCommitted, 6 ..CommitFailedRetryable, 7 ..Unretryable,
--             8 PhaseTwoRollbacked, 9 ..RollbackFailedRetryable, 10 ..Unretryable
--
--   Concurrency: every function first locks the global row it works on
--   (FOR SHARE to register, FOR UPDATE to decide or record phase two), so a
--   registration and a decision on the same xid are serialised: a branch can
--   never be added after the decision, and the decision is a compare-and-set
--   on status = 1 (Begin).  Under READ COMMITTED each statement takes a new
--   snapshot, so after waiting for a row lock a function sees what the
--   other transaction committed.

-- Ids come in blocks: block b owns [b * 4096, b * 4096 + 4095].  A node takes
-- a block with nextval() and hands out its ids from memory, so ids are unique
-- across the cluster without a round trip per id.
CREATE SEQUENCE tc_id_block_seq AS bigint START WITH 1 INCREMENT BY 1;
COMMENT ON SEQUENCE tc_id_block_seq IS
  'Blocks of 4096 ids (transaction and branch ids) reserved by tcd nodes.';

-- Move a global transaction and its branches to history and delete its rows.
CREATE FUNCTION tc__finish(p_xid text, p_status smallint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO global_history (xid, transaction_id, status, application_id,
                              transaction_name, begin_time, branches)
  SELECT g.xid, g.transaction_id, p_status, g.application_id, g.transaction_name,
         g.begin_time,
         coalesce((SELECT jsonb_agg(jsonb_build_object(
                      'branch_id', b.branch_id, 'resource_id', b.resource_id,
                      'branch_type', b.branch_type, 'status', b.status)
                    ORDER BY b.branch_id)
                   FROM branch_table b WHERE b.xid = g.xid), '[]'::jsonb)
  FROM global_table g WHERE g.xid = p_xid
  ON CONFLICT (xid) DO NOTHING;
  DELETE FROM branch_table WHERE xid = p_xid;
  DELETE FROM lock_table WHERE xid = p_xid;
  DELETE FROM global_table WHERE xid = p_xid;
END $$;

-- GlobalBegin.  A repeated idempotency key returns the xid of the first
-- begin instead of creating a second transaction.
CREATE FUNCTION tc_begin_batch(p_xid text[], p_txid bigint[], p_timeout_ms int[],
                               p_name text[], p_app text[], p_idem text[], p_node int)
RETURNS TABLE (item int, xid text, result text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  i int;
  v_xid text;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_xid, 1), 0) LOOP
    item := i;
    INSERT INTO global_table (xid, transaction_id, status, application_id,
                              transaction_name, timeout_ms, deadline, node_id, idem_key)
    VALUES (p_xid[i], p_txid[i], 1, p_app[i], p_name[i], p_timeout_ms[i],
            clock_timestamp() + p_timeout_ms[i] * interval '1 millisecond', p_node, p_idem[i])
    ON CONFLICT (idem_key) DO NOTHING;
    IF FOUND THEN
      xid := p_xid[i];
      result := 'ok';
    ELSE
      SELECT g.xid INTO v_xid FROM global_table g WHERE g.idem_key = p_idem[i];
      xid := v_xid;
      result := CASE WHEN v_xid IS NULL THEN 'finished' ELSE 'ok' END;
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;

-- BranchRegister.  Lock rows (l_*: flattened, l_item says which item each
-- belongs to) are taken in row_key order, which keeps two registrations
-- from deadlocking on each other's keys.  A key held by another xid is a
-- conflict: the keys this branch took are given back and nothing else
-- changes.  The same xid taking a key it already holds is fine.
CREATE FUNCTION tc_register_batch(p_xid text[], p_branch bigint[], p_resource text[],
                                  p_type smallint[], p_lock_keys text[], p_app_data text[],
                                  p_client text[], p_idem text[],
                                  l_item int[], l_row text[], l_table text[], l_pk text[])
RETURNS TABLE (item int, result text, branch_id bigint, holder text, holder_status smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  i int;
  g record;
  h record;
  lk record;
  v_branch bigint;
  v_conflict boolean;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_xid, 1), 0) LOOP
    item := i; branch_id := NULL; holder := NULL; holder_status := NULL;
    SELECT gt.status, gt.deadline, gt.transaction_id INTO g
      FROM global_table gt WHERE gt.xid = p_xid[i] FOR SHARE;
    IF NOT FOUND THEN
      result := 'not_found'; RETURN NEXT; CONTINUE;
    END IF;
    IF g.status <> 1 THEN
      result := 'not_active'; holder_status := g.status; RETURN NEXT; CONTINUE;
    END IF;
    IF g.deadline < clock_timestamp() THEN
      result := 'timed_out'; RETURN NEXT; CONTINUE;
    END IF;
    IF p_idem[i] IS NOT NULL THEN
      SELECT b.branch_id INTO v_branch FROM branch_table b
        WHERE b.xid = p_xid[i] AND b.idem_key = p_idem[i];
      IF FOUND THEN
        result := 'ok'; branch_id := v_branch; RETURN NEXT; CONTINUE;
      END IF;
    END IF;

    v_conflict := false;
    FOR lk IN SELECT k.r, k.t, k.p
                FROM unnest(l_item, l_row, l_table, l_pk) AS k(it, r, t, p)
               WHERE k.it = i ORDER BY k.r LOOP
      LOOP
        INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id,
                                table_name, pk)
        VALUES (lk.r, p_xid[i], g.transaction_id, p_branch[i], p_resource[i], lk.t, lk.p)
        ON CONFLICT (row_key) DO NOTHING;
        EXIT WHEN FOUND;
        SELECT l.xid, l.status INTO h FROM lock_table l WHERE l.row_key = lk.r;
        CONTINUE WHEN NOT FOUND; -- released in between: take it now
        IF h.xid <> p_xid[i] THEN
          v_conflict := true; holder := h.xid; holder_status := h.status;
        END IF;
        EXIT;
      END LOOP;
      EXIT WHEN v_conflict;
    END LOOP;

    IF v_conflict THEN
      DELETE FROM lock_table l WHERE l.branch_id = p_branch[i];
      result := CASE WHEN holder_status = 1 THEN 'holder_rollbacking' ELSE 'conflict' END;
      RETURN NEXT; CONTINUE;
    END IF;

    INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, branch_type, status,
                              lock_keys, application_data, client_id, idem_key)
    VALUES (p_branch[i], p_xid[i], g.transaction_id, p_resource[i], p_type[i], 1,
            p_lock_keys[i], p_app_data[i], p_client[i], p_idem[i]);
    result := 'ok'; branch_id := p_branch[i];
    RETURN NEXT;
  END LOOP;
END $$;

-- The decision: p_action[i] is 'commit', 'rollback' (TM) or 'timeout'
-- (timeout job).  A compare-and-set from Begin; a commit past the deadline
-- becomes a timeout rollback.  Commit releases the global locks at once
-- (AT: the data is already committed locally); rollback marks them
-- rollbacking (status 1) and keeps them until the undo is done.  A
-- transaction without branches is finished on the spot.  p_lease_ms keeps
-- the leader's retry job away while the deciding node drives phase two.
CREATE FUNCTION tc_decide_batch(p_xid text[], p_action text[], p_lease_ms int)
RETURNS TABLE (item int, result text, status smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  i int;
  g record;
  v_action text;
  v_new smallint;
  v_hist smallint;
  v_timed_out boolean;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_xid, 1), 0) LOOP
    item := i;
    SELECT gt.status, gt.deadline INTO g FROM global_table gt WHERE gt.xid = p_xid[i] FOR UPDATE;
    IF NOT FOUND THEN
      SELECT h.status INTO v_hist FROM global_history h WHERE h.xid = p_xid[i];
      IF FOUND THEN
        result := 'finished'; status := v_hist;
      ELSE
        result := 'not_found'; status := 0;
      END IF;
      RETURN NEXT; CONTINUE;
    END IF;
    IF g.status <> 1 THEN
      result := 'decided'; status := g.status; RETURN NEXT; CONTINUE;
    END IF;
    v_action := p_action[i];
    v_timed_out := g.deadline < clock_timestamp();
    IF v_action = 'timeout' AND NOT v_timed_out THEN
      result := 'not_expired'; status := 1; RETURN NEXT; CONTINUE;
    END IF;
    IF v_action = 'commit' AND v_timed_out THEN
      v_action := 'timeout';
    END IF;

    IF NOT EXISTS (SELECT 1 FROM branch_table b WHERE b.xid = p_xid[i]) THEN
      v_new := CASE v_action WHEN 'commit' THEN 9 WHEN 'rollback' THEN 11 ELSE 12 END;
      UPDATE global_table SET status = v_new, gmt_modified = clock_timestamp()
       WHERE xid = p_xid[i] AND status = 1;
      PERFORM tc__finish(p_xid[i], v_new);
    ELSE
      v_new := CASE v_action WHEN 'commit' THEN 8 WHEN 'rollback' THEN 4 ELSE 6 END;
      UPDATE global_table
         SET status = v_new, gmt_modified = clock_timestamp(),
             next_retry_at = clock_timestamp() + p_lease_ms * interval '1 millisecond'
       WHERE xid = p_xid[i] AND status = 1;
      IF v_new = 8 THEN
        DELETE FROM lock_table WHERE xid = p_xid[i];
      ELSE
        UPDATE lock_table SET status = 1 WHERE xid = p_xid[i];
      END IF;
    END IF;
    result := CASE WHEN p_action[i] = 'commit' AND v_action = 'timeout' THEN 'timed_out'
                   ELSE 'ok' END;
    status := v_new;
    RETURN NEXT;
  END LOOP;
END $$;

-- Phase-two outcomes of branches (and the phase-one report of an RM).
-- Done branches (5, 8): when no unfinished branch is left, the global
-- transaction gets its final status and moves to history.  A retryable
-- failure (6, 9) moves it to *Retrying with exponential backoff; an
-- unretryable one (7, 10: e.g. a dirty write) to *Failed, locks kept, for an
-- operator.
CREATE FUNCTION tc_phase2_batch(p_xid text[], p_branch bigint[], p_status smallint[],
                                p_error text[], p_retry_min_ms int, p_retry_max_ms int)
RETURNS TABLE (item int, result text, global_status smallint, finished boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  i int;
  g record;
  v_family text;
  v_new smallint;
  v_delay_ms double precision;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_xid, 1), 0) LOOP
    item := i; finished := false;
    SELECT gt.status, gt.retry_count INTO g FROM global_table gt
     WHERE gt.xid = p_xid[i] FOR UPDATE;
    IF NOT FOUND THEN
      result := 'not_found'; global_status := 0; RETURN NEXT; CONTINUE;
    END IF;
    UPDATE branch_table
       SET status = p_status[i], last_error = p_error[i], gmt_modified = clock_timestamp()
     WHERE branch_id = p_branch[i] AND xid = p_xid[i];
    IF NOT FOUND THEN
      result := 'branch_not_found'; global_status := g.status; RETURN NEXT; CONTINUE;
    END IF;

    v_family := CASE WHEN g.status IN (2, 3, 8, 10) THEN 'commit'
                     WHEN g.status IN (4, 5, 13) THEN 'rollback'
                     WHEN g.status IN (6, 7, 14) THEN 'timeout'
                     ELSE 'phase1' END;
    IF v_family = 'phase1' THEN
      -- A phase-one report (PhaseOneDone/Failed) while Begin: recorded only.
      result := 'ok'; global_status := g.status; RETURN NEXT; CONTINUE;
    END IF;

    IF p_status[i] IN (7, 10) THEN
      v_new := CASE v_family WHEN 'commit' THEN 10 WHEN 'rollback' THEN 13 ELSE 14 END;
      UPDATE global_table
         SET status = v_new, last_error = p_error[i], next_retry_at = NULL,
             gmt_modified = clock_timestamp()
       WHERE xid = p_xid[i];
      result := 'failed'; global_status := v_new;
    ELSIF p_status[i] IN (6, 9) THEN
      v_new := CASE v_family WHEN 'commit' THEN 3 WHEN 'rollback' THEN 5 ELSE 7 END;
      v_delay_ms := least(p_retry_max_ms::double precision,
                          p_retry_min_ms * power(2::double precision, least(g.retry_count, 20)));
      UPDATE global_table
         SET status = v_new, last_error = p_error[i], retry_count = retry_count + 1,
             next_retry_at = clock_timestamp() + v_delay_ms * interval '1 millisecond',
             gmt_modified = clock_timestamp()
       WHERE xid = p_xid[i];
      result := 'retry'; global_status := v_new;
    ELSIF NOT EXISTS (SELECT 1 FROM branch_table b
                       WHERE b.xid = p_xid[i] AND b.status NOT IN (5, 8)) THEN
      v_new := CASE v_family WHEN 'commit' THEN 9 WHEN 'rollback' THEN 11 ELSE 12 END;
      UPDATE global_table SET status = v_new WHERE xid = p_xid[i];
      PERFORM tc__finish(p_xid[i], v_new);
      result := 'ok'; global_status := v_new; finished := true;
    ELSE
      result := 'ok'; global_status := g.status;
    END IF;
    RETURN NEXT;
  END LOOP;
END $$;

-- The leader's retry job claims due sessions (phase two unfinished, lease
-- expired) without blocking other nodes (SKIP LOCKED) and extends the lease
-- so that no other node drives them meanwhile.
CREATE FUNCTION tc_claim_retries(p_limit int, p_lease_ms int)
RETURNS TABLE (xid text, status smallint)
LANGUAGE sql AS $$
  UPDATE global_table g
     SET next_retry_at = clock_timestamp() + p_lease_ms * interval '1 millisecond'
    FROM (SELECT c.xid FROM global_table c
           WHERE c.status IN (2, 3, 4, 5, 6, 7, 8)
             AND c.next_retry_at <= clock_timestamp()
           ORDER BY c.next_retry_at
           LIMIT p_limit
           FOR UPDATE SKIP LOCKED) due
   WHERE g.xid = due.xid
  RETURNING g.xid, g.status
$$;
